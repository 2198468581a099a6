"""Launching task groups as Spark jobs.

Each launch is one Spark job whose partitions each run one or more tasks of a
single operator (Drizzle's group scheduling: a job costs 50-100 ms of driver and
executor overhead here, so small tasks must share one). Jobs are submitted from a
pool of threads that lives as long as the run, in a FAIR pool named after the
operator so CPU and GPU work share executors, and tagged with the run so a failure
can cancel them all. A thread per job (PySpark's `InheritableThread`) opened a new
Py4J connection and JVM thread for every job; a job sets every local property it
needs (pool, description, tags, resources) and clears its tags, so reused threads
carry nothing from one job to the next.
On a cluster an operator that asks for GPUs or custom resources runs its jobs under a
resource profile (`profiles.py`), so Spark places its tasks where those resources are.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial

from pyspark.sql import SparkSession

from airflow_streambatch.engine.protocol.backend import JobOutcome
from airflow_streambatch.engine.spark.profiles import SPARK_RESOURCES_PROPERTY, job_property, profile_for
from airflow_streambatch.engine.worker.task_runner import run_partition


class SparkBackend:
    """Submits task groups as Spark jobs and reports their outcomes on one queue (a `protocol.backend.Backend`)."""

    def __init__(self, spark: SparkSession, run_tag: str):
        self.spark = spark
        self.sc = spark.sparkContext
        self.run_tag = run_tag
        self.outcomes: queue.Queue[JobOutcome] = queue.Queue()
        self._requests: dict[bytes, dict[str, float]] = {}  # operator payload -> its request, for `run_now`
        self._threads = _JobThreads(run_tag)

    def submit(self, launch_id: int, pool: str, op_blob: bytes, groups: list[list[bytes]],
               resources: Mapping[str, float] | None = None) -> None:
        """Run ``groups`` (one list of task specs per Spark partition) as one job, in the background.
        ``resources``: what each task of the operator asks for (``{"CPU": 1}``, ``{"GPU": 1}``)."""
        request = dict(resources or {})
        self._requests[op_blob] = request
        self._threads.submit(self._run_job, launch_id, pool, op_blob, groups, request)

    def close(self) -> None:
        """The run ended: its job threads exit once idle (none waits for them)."""
        self._threads.close()

    def _job(self, op_blob: bytes, groups: list[list[bytes]], request: Mapping[str, float]):
        """The job's RDD, one group of tasks per partition; under the operator's resource profile, if it has one."""
        rdd = self.sc.parallelize(groups, len(groups))
        profile = profile_for(self.sc, request)
        if profile is not None:
            rdd = rdd.withResources(profile)
        return rdd.mapPartitions(partial(run_partition, op_blob))

    @contextmanager
    def _marked(self, request: Mapping[str, float]) -> Iterator[None]:
        """Tell this thread's jobs' tasks what they asked Spark for (`SPARK_RESOURCES_PROPERTY`): on a
        cluster a task then takes its GPUs from Spark only, never from the driver."""
        value = job_property(self.sc, request)
        if value is not None:
            self.sc.setLocalProperty(SPARK_RESOURCES_PROPERTY, value)
        try:
            yield
        finally:
            if value is not None:
                self.sc.setLocalProperty(SPARK_RESOURCES_PROPERTY, None)

    def _run_job(self, launch_id, pool, op_blob, groups, request) -> None:
        start = time.perf_counter()
        try:
            self.sc.setLocalProperty("spark.scheduler.pool", pool)
            tasks = sum(len(g) for g in groups)
            self.sc.setJobDescription(f"streambatch {self.run_tag} {pool} ({tasks} tasks)")
            self.sc.addJobTag(self.run_tag)
            self.sc.addJobTag(self._launch_tag(launch_id))
            with self._marked(request):
                results = self._job(op_blob, groups, request).collect()
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
        request = self._requests.get(op_blob, {})
        try:
            with self._marked(request):
                return self._job(op_blob, [[spec_blob]], request).collect()[0]
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


class _JobThreads:
    """Daemon threads that submit a run's jobs, each reused by later jobs once its own ended:
    at most as many as jobs ever ran at once. Daemons, as the per-job threads were, so a job
    still running when the interpreter exits (a cancel that has not landed yet) never holds it."""

    def __init__(self, name: str):
        self._name = name
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def submit(self, fn, *args) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1  # an idle thread takes it (or one that is about to wait)
            else:
                self._threads += 1
                threading.Thread(target=self._serve, name=f"{self._name}-job-{self._threads}", daemon=True).start()
        self._work.put((fn, args))

    def _serve(self) -> None:
        while (item := self._work.get()) is not None:
            fn, args = item
            fn(*args)
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        with self._lock:
            for _ in range(self._threads):
                self._work.put(None)
            self._threads = self._idle = 0
