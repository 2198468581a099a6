"""Sensor -> operator DAGs under ``dag.test()`` on real local Spark: epochs, failures, clears.

A second ``dag.test()`` for the same logical date replaces the DAG run, dropping its
task state: the resume these tests see comes from the durable epoch record and the
commit records alone (what a clear on Airflow >= 3.4 without "keep task state" leaves).
A clear of the same task instance through the REST API is tested in test_standalone.py.
"""

from __future__ import annotations

import glob
import json
import os
import threading
import time

import pendulum
import pyarrow.parquet as pq
import pytest
from pipelines import partitions_run, take_partitions_run, write_inputs

LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")


def _run(dag, root, **conf):
    # every param explicitly: dag.test() leaves a run's conf in the shared DAG object's params
    conf = {"root": str(root), "fail_partitions": [], "full_recompute": False, "kill_driver_on": -1, **conf}
    dr = dag.test(logical_date=LOGICAL, run_after=LOGICAL, run_conf=conf)
    return {ti.task_id: ti.state for ti in dr.get_task_instances()}


def _output_ids(root) -> list[int]:
    files = sorted(glob.glob(f"{root}/out/2026-11-22/p*/*.parquet"))
    return sorted(i for f in files for i in pq.read_table(f)["id"].to_pylist())


def _record(root) -> dict:
    return json.loads((root / "out" / "2026-11-22" / "_epoch.json").read_text())


def _epoch(root, partitions=4, marker=True):
    epoch_in = root / "in" / "2026-11-22"
    write_inputs(epoch_in, partitions=partitions)
    if marker:
        (epoch_in / "_SUCCESS").write_text("")
    (root / "runs").mkdir()


def _runs(root) -> list[int]:
    """Partitions processed since the last call (and forget them)."""
    return take_partitions_run(root / "runs")


def _task_state(dag_id, task_id) -> dict:
    from airflow import settings
    from airflow.models.task_state_store import TaskStateStoreModel
    from sqlalchemy import select

    with settings.Session() as session:
        rows = session.scalars(select(TaskStateStoreModel).where(
            TaskStateStoreModel.dag_id == dag_id, TaskStateStoreModel.task_id == task_id)).all()
        return {row.key: json.loads(row.value) for row in rows}


def _xcoms(dag_id) -> dict:
    """(task_id, key) -> value of the DAG's XComs (dag.test() keeps one run per logical date)."""
    from airflow import settings
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    with settings.Session() as session:
        rows = session.scalars(select(XComModel).where(XComModel.dag_id == dag_id)).all()
        return {(row.task_id, row.key): XComModel.deserialize_value(row) for row in rows}


def _asset_events(uri) -> list[dict]:
    from airflow import settings
    from airflow.models.asset import AssetEvent, AssetModel
    from sqlalchemy import select

    with settings.Session() as session:
        events = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                                 .where(AssetModel.uri == uri).order_by(AssetEvent.id)).all()
        return [dict(e.extra) for e in events]


@pytest.mark.parametrize("spark_kind", ["classic", "connect"])  # conftest.ctx
def test_a_failed_partition_fails_the_task_and_a_clear_reruns_only_it(ctx, airflow_db, tmp_path):
    from streambatch_test_dags import SCORES, sb_epoch

    _epoch(tmp_path)
    (tmp_path / "fail").write_text("")
    events_before = len(_asset_events(SCORES.uri))

    assert _run(sb_epoch, tmp_path, fail_partitions=[1, 3]) == {"wait_for_epoch": "success", "score": "failed"}
    record = _record(tmp_path)
    assert [p["state"] for p in record["partitions"]] == ["committed", "failed", "committed", "failed"]
    assert "scorer rejects partition(s) [1]" in record["partitions"][1]["error"]
    assert set(_runs(tmp_path)) == {0, 1, 2, 3}
    state = _task_state("sb_epoch", "score")["epoch_progress"]
    assert state["committed"] == 2 and state["failed"] == 2 and state["status"] == "failed"
    assert [f["index"] for f in state["failed_partitions"]] == [1, 3] and "scorer rejects" in state[
        "failed_partitions"][0]["error"]
    assert state["partitions"] == 4 and state["rows"] == 200
    # XCom: the sensor's pointer to the manifest it wrote, the operator's bounded summary (not the record)
    xcoms = _xcoms("sb_epoch")
    pointer, outcome = xcoms[("wait_for_epoch", "return_value")], xcoms[("score", "return_value")]
    assert pointer["manifest_uri"].startswith(f"file://{tmp_path}/out/2026-11-22/_manifests/manifest-")  # beside
    assert not glob.glob(f"{tmp_path}/in/**/_manifests", recursive=True)  # never under the input
    assert pointer["partitions"] == 4 and pointer["fingerprint"] == record["fingerprint"]
    assert outcome["failed"] == 2 and outcome["pending"] == 0 and outcome["failed_left_out"] == 0
    assert outcome["record_uri"] == f"file://{tmp_path}/out/2026-11-22/_epoch.json"
    assert outcome["manifest_uri"] == pointer["manifest_uri"] and "partitions" not in outcome["metrics"]
    assert len(json.dumps(pointer)) < 1024 and len(json.dumps(outcome)) < 8192
    assert len(_asset_events(SCORES.uri)) == events_before  # a failed epoch emits no asset event

    (tmp_path / "fail").unlink()
    assert _run(sb_epoch, tmp_path, fail_partitions=[1, 3]) == {"wait_for_epoch": "success", "score": "success"}
    assert _runs(tmp_path) == [1, 3]
    assert _output_ids(tmp_path) == list(range(400))
    record = _record(tmp_path)
    assert record["status"] == "succeeded" and record["tries"] == 2
    assert [p["this_try"] for p in record["partitions"]] == [False, True, False, True]
    assert _task_state("sb_epoch", "score")["epoch_progress"]["committed"] == 4
    event = _asset_events(SCORES.uri)[-1]
    assert event["committed"] == 4 and event["rows"] == 400 and event["output_path"].endswith("out/2026-11-22")


def _inputs_on_s3(tmp_path, s3_bucket, partitions: int = 4):
    import pyarrow.fs as pafs

    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    write_inputs(tmp_path / "in", partitions=partitions)
    for name in sorted(os.listdir(tmp_path / "in")):
        with open(tmp_path / "in" / name, "rb") as src, fs.open_output_stream(f"{bucket}/in/2026-11-22/{name}") as dst:
            dst.write(src.read())
    with fs.open_output_stream(f"{bucket}/in/2026-11-22/_SUCCESS"):
        pass
    (tmp_path / "runs").mkdir()
    return fs, bucket


@pytest.mark.parametrize("spark_kind", ["classic", "connect"])  # conftest.ctx
def test_an_epoch_on_s3_fails_a_partition_and_a_clear_reruns_only_it(ctx, airflow_db, tmp_path, s3_bucket):
    """Input and output on the S3 server (before the output layer: the first commit failed)."""
    import pyarrow.dataset as pads
    from streambatch_test_dags import sb_epoch_s3

    fs, bucket = _inputs_on_s3(tmp_path, s3_bucket)
    (tmp_path / "fail").write_text("")
    assert _run(sb_epoch_s3, tmp_path, store=s3_bucket, fail_partitions=[1]) == {"wait_for_epoch": "success",
                                                                                   "score": "failed"}
    assert set(_runs(tmp_path)) == {0, 1, 2, 3}
    (tmp_path / "fail").unlink()
    assert _run(sb_epoch_s3, tmp_path, store=s3_bucket, fail_partitions=[1])["score"] == "success"
    assert _runs(tmp_path) == [1]
    out = pads.dataset(f"{bucket}/out/2026-11-22", filesystem=fs, ignore_prefixes=["_", "."])
    assert sorted(out.to_table(columns=["id"])["id"].to_pylist()) == list(range(400))  # each row once


def test_an_epoch_into_a_delta_table_on_s3_reruns_only_its_failed_partition(ctx, airflow_db, tmp_path, s3_bucket):
    from deltalake import DeltaTable
    from streambatch_test_dags import sb_epoch_s3_delta

    from airflow_streambatch.engine.output.delta import default_storage_options

    _inputs_on_s3(tmp_path, s3_bucket)
    (tmp_path / "fail").write_text("")
    assert _run(sb_epoch_s3_delta, tmp_path, store=s3_bucket, fail_partitions=[2])["score"] == "failed"
    assert set(_runs(tmp_path)) == {0, 1, 2, 3}
    (tmp_path / "fail").unlink()
    assert _run(sb_epoch_s3_delta, tmp_path, store=s3_bucket, fail_partitions=[2])["score"] == "success"
    assert _runs(tmp_path) == [2]
    table = f"{s3_bucket}/scores_delta"
    rows = DeltaTable(table, storage_options=default_storage_options(table)).to_pyarrow_table(columns=["id"])
    assert sorted(rows["id"].to_pylist()) == list(range(400))
    summary = _xcoms("sb_epoch_s3_delta")[("score", "return_value")]
    assert summary["table"] == f"delta table {table}"
    epoch = "2026-11-22T10_00_00+00_00--2026-11-22T10_00_00+00_00"
    assert summary["record_uri"] == f"{table}/_streambatch/epochs/{epoch}/_epoch.json"  # beside the table


def test_a_clear_after_success_reruns_nothing_unless_full_recompute(ctx, airflow_db, tmp_path):
    from streambatch_test_dags import sb_epoch

    _epoch(tmp_path, partitions=3)
    assert _run(sb_epoch, tmp_path)["score"] == "success"
    assert sorted(set(_runs(tmp_path))) == [0, 1, 2]
    first_files = sorted(glob.glob(f"{tmp_path}/out/2026-11-22/p*/*.parquet"))

    assert _run(sb_epoch, tmp_path)["score"] == "success"
    assert _runs(tmp_path) == []  # nothing ran on Spark
    assert sorted(glob.glob(f"{tmp_path}/out/2026-11-22/p*/*.parquet")) == first_files

    assert _run(sb_epoch, tmp_path, full_recompute=True)["score"] == "success"
    assert sorted(set(_runs(tmp_path))) == [0, 1, 2]
    assert _output_ids(tmp_path) == list(range(300))
    assert _record(tmp_path)["tries"] == 1  # the recompute wiped the epoch's history with its output


def test_changed_inputs_after_a_partial_commit_are_refused_with_the_switch_to_use(ctx, airflow_db, tmp_path):
    from streambatch_test_dags import sb_epoch

    _epoch(tmp_path, partitions=3)
    (tmp_path / "fail").write_text("")
    assert _run(sb_epoch, tmp_path, fail_partitions=[2])["score"] == "failed"
    write_inputs(tmp_path / "in" / "2026-11-22", partitions=3, rows=50)  # the producer rewrote the epoch
    (tmp_path / "fail").unlink()
    assert _run(sb_epoch, tmp_path)["score"] == "failed"
    assert _record(tmp_path)["status"] == "failed"  # left as it was: nothing mixed in
    assert _output_ids(tmp_path) == list(range(200))
    assert _run(sb_epoch, tmp_path, full_recompute=True)["score"] == "success"
    assert _output_ids(tmp_path) == [100 * p + i for p in range(3) for i in range(50)]


def test_deferrable_sensor_waits_in_the_trigger_until_the_marker_appears(ctx, airflow_db, tmp_path):
    from streambatch_test_dags import sb_epoch_deferrable

    _epoch(tmp_path, partitions=2, marker=False)
    marker = tmp_path / "in" / "2026-11-22" / "_SUCCESS"
    threading.Timer(3.0, marker.write_text, args=("",)).start()
    started = time.monotonic()
    assert _run(sb_epoch_deferrable, tmp_path) == {"wait_for_epoch": "success", "score": "success"}
    assert time.monotonic() - started >= 3.0
    assert _output_ids(tmp_path) == list(range(200))


def test_reschedule_sensor_freezes_the_listing_after_a_quiet_period(ctx, airflow_db, tmp_path):
    from streambatch_test_dags import sb_epoch_quiet

    _epoch(tmp_path, partitions=2, marker=False)
    assert _run(sb_epoch_quiet, tmp_path) == {"wait_for_epoch": "success", "score": "success"}
    record = _record(tmp_path)
    assert [p["path"].rsplit("/", 1)[-1] for p in record["partitions"]] == ["part-000.parquet", "part-001.parquet"]
    assert _task_state("sb_epoch_quiet", "wait_for_epoch")["epoch_frontier_state"]["since"] > 0


def test_spark_submit_deploy_mode_runs_the_epoch_as_its_own_application(ctx, airflow_db, tmp_path, monkeypatch):
    from streambatch_test_dags import sb_epoch_spark_submit

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", '{"conn_type": "spark", "host": "local[2]"}')
    _epoch(tmp_path, partitions=3)
    (tmp_path / "fail").write_text("")
    assert _run(sb_epoch_spark_submit, tmp_path, fail_partitions=[0])["score"] == "failed"
    by_driver = partitions_run(tmp_path / "runs", by_driver=True)
    assert len(by_driver) == 1 and os.getpid() not in by_driver  # a driver of its own, not this process
    assert [p["state"] for p in _record(tmp_path)["partitions"]] == ["failed", "committed", "committed"]

    (tmp_path / "fail").unlink()
    _runs(tmp_path)
    assert _run(sb_epoch_spark_submit, tmp_path)["score"] == "success"
    assert _runs(tmp_path) == [0]
    assert _output_ids(tmp_path) == list(range(300))
