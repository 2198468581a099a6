"""Launching task groups as Spark jobs.

Each launch is one Spark job whose partitions each run one or more tasks of a
single operator (Drizzle's group scheduling: a job costs 50-100 ms of driver and
executor overhead here, so small tasks must share one). Jobs are submitted from
their own `InheritableThread`, in a FAIR pool named after the operator so CPU and
GPU work share executors, and tagged with the run so a failure can cancel them all.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass
from functools import partial

from pyspark import InheritableThread
from pyspark.sql import SparkSession

from airflow_streambatch.engine.worker.task_runner import run_partition


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
