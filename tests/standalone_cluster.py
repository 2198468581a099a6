"""A real Spark standalone cluster (master + workers) started from the pip-installed pyspark.

pip's pyspark ships ``bin/spark-class`` but not ``sbin/start-*.sh``, so the daemons
are started directly. Each runs in its own process group, and executors and Python
workers are its descendants: ``stop()`` kills the groups, leaving no process behind.
Used by the cluster fault tests and by benchmark W6.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pyspark
from ports import free_port  # also imported from here by the cluster tests


class StandaloneCluster:
    def __init__(self, work_dir: str, workers: int = 2, cores: int = 2, memory: str = "1g",
                 worker_conf: dict[int, dict[str, str]] | None = None):
        """``worker_conf`` maps a worker's index to Spark settings of that worker only (e.g.
        ``spark.worker.resource.gpu.amount`` and its discovery script), passed as ``SPARK_WORKER_OPTS``."""
        self.work_dir = work_dir
        self.worker_conf = worker_conf or {}
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []

    def _env(self, conf: dict[str, str] | None = None) -> dict:
        env = dict(os.environ)
        env.update(SPARK_HOME=os.path.dirname(pyspark.__file__), SPARK_LOCAL_IP="127.0.0.1",
                   PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
        if conf:
            env["SPARK_WORKER_OPTS"] = " ".join(f"-D{key}={value}" for key, value in conf.items())
        return env

    def _spawn(self, name: str, *args: str, conf: dict[str, str] | None = None) -> None:
        spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
        log = open(os.path.join(self.work_dir, f"{name}.log"), "w")
        self.procs.append(subprocess.Popen([spark_class, *args], env=self._env(conf), stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def start(self, timeout: float = 90) -> StandaloneCluster:
        os.makedirs(self.work_dir, exist_ok=True)
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        for i in range(self.workers):
            work = os.path.join(self.work_dir, f"worker-{i}")
            os.makedirs(work, exist_ok=True)
            self._spawn(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                        "--cores", str(self.cores), "--memory", self.memory, "--work-dir", work,
                        "--webui-port", str(free_port()), conf=self.worker_conf.get(i))
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.alive_workers() == self.workers:
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"standalone cluster did not come up in {timeout}s; logs in {self.work_dir}")

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                import json

                return int(json.loads(r.read()).get("aliveworkers", 0))
        except (OSError, ValueError):  # not up yet, or the master still answers with its HTML page
            return 0

    def executor_pids(self) -> list[int]:
        """PIDs of executor JVMs (children of the workers)."""
        out = subprocess.run(["pgrep", "-f", "CoarseGrainedExecutorBackend"], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def stop(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            proc.wait(timeout=30)
        # executors re-parented away from a dead worker's group: none may survive us
        for pid in self.executor_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs.clear()
