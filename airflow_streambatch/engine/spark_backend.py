"""Spark as the dataplane: the session, execution slots, and launching task groups as jobs.

Each launch is one Spark job whose partitions each run one or more tasks of a
single operator (Drizzle's group scheduling: a job costs 50-100 ms of driver and
executor overhead here, so small tasks must share one). Jobs are submitted from
their own `InheritableThread`, in a FAIR pool named after the operator so CPU and
GPU work share executors, and tagged with the run so a failure can cancel them all.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import queue
import re
import site
import sys
import sysconfig
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from functools import partial

from pyspark import InheritableThread
from pyspark.sql import SparkSession

from airflow_streambatch.engine.java import ensure_java
from airflow_streambatch.engine.tasks import run_partition

_session_lock = threading.Lock()
# py4j logs every finished job thread's connection at INFO; that drowns the progress lines.
logging.getLogger("py4j").setLevel(logging.WARNING)


def get_spark(min_slots: int = 0) -> SparkSession:
    """The active SparkSession, or a local one with at least ``min_slots`` task slots."""
    with _session_lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        ensure_java()
        slots = max(os.cpu_count() or 1, int(min_slots))
        spark = (
            SparkSession.builder.master(f"local[{slots}]")
            .appName("airflow-streambatch")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.scheduler.mode", "FAIR")
            .config("spark.python.worker.reuse", "true")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("WARN")
        return spark


_shipped: set[tuple[str, str]] = set()  # (application id, top-level module) already added


def _zip_package(package_dir: str) -> str:
    name = os.path.basename(package_dir.rstrip(os.sep))
    archive = os.path.join(tempfile.mkdtemp(prefix="streambatch-pyfiles-"), f"{name}.zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for folder, _, files in os.walk(package_dir):
            for file_name in files:
                if file_name.endswith(".py"):
                    path = os.path.join(folder, file_name)
                    zf.write(path, os.path.relpath(path, os.path.dirname(package_dir.rstrip(os.sep))))
    return archive


def _add_py_files(spark: SparkSession, module_name: str) -> None:
    """``addPyFile`` the top-level module or package of ``module_name`` (once per application)."""
    sc = spark.sparkContext
    top = module_name.split(".")[0]
    if (sc.applicationId, top) in _shipped:
        return
    path = getattr(importlib.import_module(top), "__file__", None)
    if path is None:
        return  # a namespace package: nothing to zip
    if os.path.basename(path) == "__init__.py":
        sc.addPyFile(_zip_package(os.path.dirname(path)))
    else:
        sc.addPyFile(path)
    _shipped.add((sc.applicationId, top))


def ship_package(spark: SparkSession) -> None:
    """Make this package importable on a cluster's executors (once per application).

    Tasks run ``airflow_streambatch.engine.tasks`` on the executors' Python workers,
    so a cluster whose workers do not have the package installed gets it as a zip
    through ``addPyFile``, the way ``spark-submit --py-files`` ships code. Local
    masters share the driver's interpreter and need nothing.
    """
    if not spark.sparkContext.master.startswith("local"):
        _add_py_files(spark, "airflow_streambatch")


def ship_user_module(spark: SparkSession, module_name: str) -> None:
    """Make a user's pipeline module importable by Spark's Python workers, local ones included.

    Airflow puts the DAG folder on the task's ``sys.path`` but not in ``PYTHONPATH``,
    so Python workers could not import a pipeline module that lives there, nor the
    UDF classes it defines (cloudpickle refers to them by module name). Modules
    installed in site-packages are left alone: workers import them like the driver.
    """
    top = module_name.split(".")[0]
    path = getattr(importlib.import_module(top), "__file__", None) or ""
    installed = any(path.startswith(p) for p in (*site.getsitepackages(), sysconfig.get_paths()["stdlib"]))
    if path and not installed and top != "airflow_streambatch":
        _add_py_files(spark, top)


def slots_from_spark(spark: SparkSession) -> dict[str, float]:
    """Execution slots Spark offers: task slots as CPU, executor GPUs as GPU."""
    sc = spark.sparkContext
    conf = sc.getConf()
    slots: dict[str, float] = {"CPU": float(sc.defaultParallelism)}
    gpus_per_executor = float(conf.get("spark.executor.resource.gpu.amount", "0"))
    if gpus_per_executor and not sc.master.startswith("local["):
        executors = max(1, len(sc._jsc.sc().getExecutorMemoryStatus()) - 1)
        slots["GPU"] = gpus_per_executor * executors
    return slots


def spark_task_slots(spark: SparkSession) -> int:
    """Spark tasks that run at once: ``local[N]`` threads, else the executors' cores
    (Spark's default parallelism), divided by ``spark.task.cpus``."""
    sc = spark.sparkContext
    local = re.match(r"local(?:\[(\d+|\*)(?:,\d+)?\])?$", sc.master)
    if local:
        cores = 1 if local.group(1) is None else (os.cpu_count() or 1) if local.group(1) == "*" else int(local.group(1))
    else:
        cores = sc.defaultParallelism
    return max(1, cores // max(1, int(sc.getConf().get("spark.task.cpus", "1"))))


@dataclass
class JobOutcome:
    """What came back from one Spark job: per-task result blobs, or the exception."""

    launch_id: int
    results: list[bytes] | None
    error: BaseException | None
    wall_s: float


class SparkBackend:
    """Submits task groups as Spark jobs and reports their outcomes on one queue."""

    def __init__(self, spark: SparkSession, run_tag: str):
        self.spark = spark
        self.sc = spark.sparkContext
        self.run_tag = run_tag
        self.outcomes: queue.Queue[JobOutcome] = queue.Queue()

    def submit(self, launch_id: int, pool: str, op_blob: bytes, groups: list[list[bytes]]) -> None:
        """Run ``groups`` (one list of task specs per Spark partition) as one job, in the background."""
        thread = InheritableThread(target=self._run_job, args=(launch_id, pool, op_blob, groups), daemon=True)
        thread.start()

    def _run_job(self, launch_id, pool, op_blob, groups) -> None:
        start = time.perf_counter()
        try:
            self.sc.setLocalProperty("spark.scheduler.pool", pool)
            tasks = sum(len(g) for g in groups)
            self.sc.setJobDescription(f"streambatch {self.run_tag} {pool} ({tasks} tasks)")
            self.sc.addJobTag(self.run_tag)
            self.sc.addJobTag(self._launch_tag(launch_id))
            rdd = self.sc.parallelize(groups, len(groups))  # one element, one partition
            results = rdd.mapPartitions(partial(run_partition, op_blob)).collect()
            outcome = JobOutcome(launch_id, results, None, time.perf_counter() - start)
        except BaseException as exc:  # noqa: BLE001 - reported to the scheduler loop
            outcome = JobOutcome(launch_id, None, exc, time.perf_counter() - start)
        finally:
            try:
                self.sc.clearJobTags()  # job tags are per thread, and this thread ends here
            except Exception:  # noqa: BLE001 - the context may be stopping
                pass
        self.outcomes.put(outcome)

    def run_now(self, op_blob: bytes, spec_blob: bytes) -> bytes:
        """Run one task as a Spark job in the calling thread (lineage replays)."""
        self.sc.addJobTag(self.run_tag)
        try:
            return self.sc.parallelize([[spec_blob]], 1).mapPartitions(partial(run_partition, op_blob)).collect()[0]
        finally:
            self.sc.removeJobTag(self.run_tag)

    def _launch_tag(self, launch_id: int) -> str:
        return f"{self.run_tag}-launch-{launch_id}"

    def cancel_launch(self, launch_id: int) -> None:
        """Cancel one job (a timed-out task): Spark kills its tasks and their Python workers."""
        self.sc.cancelJobsWithTag(self._launch_tag(launch_id))

    def cancel(self) -> None:
        try:
            self.sc.cancelJobsWithTag(self.run_tag)
        except Exception:  # noqa: BLE001 - best effort on shutdown
            pass


class GroupSizer:
    """Tasks per Spark partition (the depth of a group), one instance per operator.

    Drizzle amortizes scheduling by putting several tasks in one job. Here a job's
    overhead (wall time minus its longest partition's work) is measured after every
    job (moving average), and the depth is the smallest that keeps that overhead
    under ``bound`` of the partition's work: ``ceil(overhead / (bound * task_s))``.
    Depth 1 for tasks of seconds (full pipelining), up to ``max_size`` for 10 ms tasks.
    Drizzle's AIMD doubling was tried first: one slow first job (worker start-up)
    doubled the depth of 1 s tasks to 4 and left slots idle (W3 ran 30% slower), so
    the first job of an operator is not counted, and depth is capped by the ready
    tasks per slot (W6 once packed 16 tasks of 2 s onto the one slot that was free).
    """

    def __init__(self, bound: float, max_size: int, enabled: bool = True):
        self.bound = bound
        self.max_size = max_size if enabled else 1
        self.job_overhead_s: float | None = None
        self.overhead_s = 0.0
        self.tasks = 0
        self.jobs = 0

    def observe(self, wall_s: float, partition_work_s: list[float], tasks: int) -> None:
        overhead = max(0.0, wall_s - max(partition_work_s, default=0.0))
        self.overhead_s += overhead
        self.tasks += tasks
        self.jobs += 1
        if self.jobs == 1:
            return  # the first job pays Python worker (and executor) start-up: not steady overhead
        prev = self.job_overhead_s
        self.job_overhead_s = overhead if prev is None else 0.7 * prev + 0.3 * overhead

    def depth(self, task_s: float, ready: int, slots: int) -> int:
        """Tasks per partition for the next job: enough to amortize the overhead, but no
        more than this partition's share of the ready tasks over all of the operator's
        slots, so packing never serializes work that other slots could take."""
        if self.job_overhead_s is None or task_s <= 0:
            return 1
        wanted = math.ceil(self.job_overhead_s / (self.bound * task_s))
        return max(1, min(self.max_size, wanted, math.ceil(ready / max(1, slots))))

    @property
    def overhead_per_task_s(self) -> float:
        return self.overhead_s / self.tasks if self.tasks else 0.0
