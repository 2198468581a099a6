"""A real `airflow standalone` (SQLite, its own AIRFLOW_HOME, LocalExecutor) driven through its REST API.

Starting one costs about a minute, so `conftest.py` starts one per test session and every
test module that needs it shares it; a module names the DAG ids it needs with `wait_dags`.
The server inherits the test session's environment (DAGS_FOLDER, PYTHONPATH), so it parses
the DAGs under tests/provider/dags and imports the test pipelines like any task would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil
from ports import free_port


class Standalone:
    """`airflow standalone` in a process group of its own, stopped with everything it started."""

    def __init__(self, home: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/v2"
        bin_dir = os.path.dirname(sys.executable)  # standalone starts `airflow scheduler` etc. from PATH
        env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                   AIRFLOW_HOME=home, AIRFLOW__API__PORT=str(self.port),
                   AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{self.port}",  # links name the UI's real address
                   AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{self.port}/execution/",
                   AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
                   AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False", AIRFLOW__CORE__PARALLELISM="4",
                   AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL="5",
                   # a task's first call (PATCH .../run) can wait 30+ s for SQLite while the DAG processor
                   # writes; at the default 5 s the retry finds the task running and the task fails to start
                   AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT="90")
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

    def wait_healthy(self, timeout: float = 240) -> None:
        """Wait until the API answers and the scheduler reports healthy."""
        self._wait(lambda: self.call("GET", "/monitor/health")["scheduler"]["status"] == "healthy",
                   timeout, "healthy")

    def wait_dags(self, dag_ids: list[str], timeout: float = 240) -> None:
        """Wait until the DAG processor has parsed every one of `dag_ids` into the metadata database."""
        def parsed() -> bool:
            dags = {d["dag_id"] for d in self.call("GET", "/dags?limit=1000")["dags"]}
            return set(dag_ids) <= dags
        self._wait(parsed, timeout, f"showing DAGs {sorted(dag_ids)}")

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"airflow standalone exited; see {self.log_path}"
            try:
                if ready():
                    return
            except (urllib.error.URLError, ConnectionError, KeyError):
                pass
            time.sleep(2)
        raise TimeoutError(f"airflow standalone not {what} after {timeout} s; see {self.log_path}")

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
