"""End to end on `airflow standalone` (SQLite, its own AIRFLOW_HOME, LocalExecutor), through its REST API.

What a user does from the UI: trigger an epoch, see the task fail naming the failed
partitions, press Clear, and get only those partitions recomputed; and what Airflow
does alone: retry a task whose process (the Spark driver) was killed mid-epoch.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
import pyarrow.parquet as pq
import pytest
from pipelines import partitions_run, write_inputs

DAY = "2026-11-22"
INTERVAL = {"logical_date": f"{DAY}T10:00:00Z", "data_interval_start": f"{DAY}T10:00:00Z",
            "data_interval_end": f"{DAY}T11:00:00Z"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Standalone:
    """`airflow standalone` in a process group of its own, stopped with everything it started."""

    def __init__(self, home: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/v2"
        bin_dir = os.path.dirname(sys.executable)  # standalone starts `airflow scheduler` etc. from PATH
        env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                   AIRFLOW_HOME=home, AIRFLOW__API__PORT=str(self.port),
                   AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{self.port}/execution/",
                   AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
                   AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False", AIRFLOW__CORE__PARALLELISM="4",
                   AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL="5")
        self.log_path = os.path.join(home, "standalone.log")
        self.log = open(self.log_path, "w")
        airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
        self.proc = subprocess.Popen([airflow, "standalone"], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def call(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
            return json.loads(text) if text.startswith(("{", "[")) else text

    def wait_healthy(self, dag_ids: list[str], timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"airflow standalone exited; see {self.log_path}"
            try:
                health = self.call("GET", "/monitor/health")
                dags = {d["dag_id"] for d in self.call("GET", "/dags?limit=100")["dags"]}
                if health["scheduler"]["status"] == "healthy" and set(dag_ids) <= dags:
                    return
            except (urllib.error.URLError, ConnectionError, KeyError):
                pass
            time.sleep(2)
        raise TimeoutError(f"airflow standalone not ready after {timeout} s; see {self.log_path}")

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]
            if state in ("success", "failed"):
                return state
            time.sleep(2)
        raise TimeoutError(f"{dag_id} run {run_id} not finished after {timeout} s; see {self.log_path}")

    def task(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        log = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}")
        return json.dumps(log)

    def stop(self) -> None:
        try:
            family = [self.proc, *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            family = []
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        psutil.wait_procs([p for p in family if isinstance(p, psutil.Process)], timeout=15)
        for p in family:
            try:
                p.kill()
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass
        self.log.close()


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    home = str(tmp_path_factory.mktemp("airflow-standalone-home"))
    server = Standalone(home)
    try:
        server.wait_healthy(["sb_epoch", "sb_epoch_retry"])
        yield server
    finally:
        server.stop()


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
    assert links["Epoch output"] == f"file://{tmp_path}/out/{DAY}" and links["Spark UI"].startswith("http://")


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
