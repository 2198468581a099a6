"""End to end on `airflow standalone` (SQLite, its own AIRFLOW_HOME, LocalExecutor), through its REST API.

What a user does from the UI: trigger an epoch, see the task fail naming the failed
partitions, press Clear, and get only those partitions recomputed; and what Airflow
does alone: retry a task whose process (the Spark driver) was killed mid-epoch.
"""

from __future__ import annotations

import glob
import json
import os
import urllib.request
from urllib.parse import quote

import pyarrow.parquet as pq
import pytest
from pipelines import partitions_run, write_inputs

DAY = "2026-11-22"
INTERVAL = {"logical_date": f"{DAY}T10:00:00Z", "data_interval_start": f"{DAY}T10:00:00Z",
            "data_interval_end": f"{DAY}T11:00:00Z"}


@pytest.fixture(scope="module")
def standalone(standalone):
    """The session's shared server (tests/provider/conftest.py), once it has parsed this module's DAGs."""
    standalone.wait_dags(["sb_epoch", "sb_epoch_retry"])
    return standalone


def _epoch(root, partitions=4):
    write_inputs(root / "in" / DAY, partitions=partitions)
    (root / "in" / DAY / "_SUCCESS").write_text("")
    (root / "runs").mkdir()
    (root / "fail").write_text("")


def _output_ids(root) -> list[int]:
    files = sorted(glob.glob(f"{root}/out/{DAY}/p*/*.parquet"))
    return sorted(i for f in files for i in pq.read_table(f)["id"].to_pylist())


def _trigger(server, dag_id, root, **conf) -> str:
    body = {**INTERVAL, "conf": {"root": str(root), **conf}}
    return server.call("POST", f"/dags/{dag_id}/dagRuns", body)["dag_run_id"]


def test_clear_through_the_rest_api_reruns_only_the_failed_partitions(standalone, tmp_path):
    _epoch(tmp_path)
    run_id = _trigger(standalone, "sb_epoch", tmp_path, fail_partitions=[1, 3])
    assert standalone.wait_run("sb_epoch", run_id) == "failed"
    ti = standalone.task("sb_epoch", run_id, "score")
    assert ti["state"] == "failed" and ti["try_number"] == 1
    log = standalone.task_log("sb_epoch", run_id, "score", 1)
    assert "2 of 4 input partition(s)" in log and "part-001.parquet" in log and "part-003.parquet" in log
    assert "reruns only these 2 partition(s)" in log
    assert set(partitions_run(tmp_path / "runs")) == {0, 1, 2, 3}

    (tmp_path / "fail").unlink()
    for f in (tmp_path / "runs").iterdir():
        f.unlink()
    cleared = standalone.call("POST", "/dags/sb_epoch/clearTaskInstances", {
        "dry_run": False, "dag_run_id": run_id, "task_ids": ["score"], "only_failed": True})
    assert [t["task_id"] for t in cleared["task_instances"]] == ["score"]
    assert standalone.wait_run("sb_epoch", run_id) == "success"
    ti = standalone.task("sb_epoch", run_id, "score")
    assert ti["state"] == "success" and ti["try_number"] == 2
    assert partitions_run(tmp_path / "runs") == [1, 3]
    assert _output_ids(tmp_path) == list(range(400))
    log = standalone.task_log("sb_epoch", run_id, "score", 2)
    assert "2 committed by earlier tries" in log
    assert "the task state store holds try 1 (failed): 2 partition(s) committed, 2 failed" in log
    links = standalone.call("GET", f"/dags/sb_epoch/dagRuns/{run_id}/taskInstances/score/links")["extra_links"]
    view = f"http://127.0.0.1:{standalone.port}/streambatch/epochs/sb_epoch/{quote(run_id, safe='')}/score?map_index=-1"
    assert links["Epoch output"] == view and links["Spark UI"].startswith("http://")
    with urllib.request.urlopen(view, timeout=60) as response:  # the link works: the epoch view of this run
        page = response.read().decode()
    assert f"file://{tmp_path}/out/{DAY}" in page and "4 of 4" in page


def test_a_killed_driver_is_resumed_by_the_retry_from_the_committed_partitions(standalone, tmp_path):
    _epoch(tmp_path, partitions=6)
    run_id = _trigger(standalone, "sb_epoch_retry", tmp_path, kill_driver_on=5)
    assert standalone.wait_run("sb_epoch_retry", run_id) == "success"
    assert standalone.task("sb_epoch_retry", run_id, "score")["try_number"] == 2
    assert not (tmp_path / "fail").exists()  # the kill happened

    by_driver = partitions_run(tmp_path / "runs", by_driver=True)
    assert len(by_driver) == 2, by_driver  # two drivers: the killed try and the retry
    record = json.loads((tmp_path / "out" / DAY / "_epoch.json").read_text())
    kept = {p["index"] for p in record["partitions"] if not p["this_try"]}
    redone = {p["index"] for p in record["partitions"] if p["this_try"]}
    assert kept and 5 in redone  # the first try committed some partitions, not the one it died in
    (first_pid, first), (retry_pid, retry) = sorted(by_driver.items(), key=lambda kv: min(
        os.stat(f).st_mtime for f in glob.glob(f"{tmp_path}/runs/{kv[0]}-*.run")))
    assert set(retry) == redone and not set(retry) & kept  # the retry ran only uncommitted partitions
    assert _output_ids(tmp_path) == list(range(600))  # every row exactly once
