"""Launching task groups through a Spark Connect session: one DataFrame job per launch.

A Connect client cannot make RDDs, so a launch of n groups is ``spark.range(n)`` in n
partitions, one id each, mapped with ``mapInArrow``: the task of partition i runs group i
through the same `worker.task_runner.run_partition` a classic job runs, and returns what it
returns (lineage replays) as binary rows. The groups travel inside the function, as the
operator's payload does in a classic job's closure. Jobs carry Connect operation tags (the
run's, and one per launch), so a timed-out launch or a failed run is interrupted by tag.

On a cluster an operator that asks for GPUs or custom resources runs its launches under a
resource profile created on the server (`connect_profiles`), and, as Connect has no local
properties, the mark that tells its tasks so (`profiles.SPARK_RESOURCES_ENV`) is set in the
worker's environment with the rest. What a classic job has and this one does not: a FAIR
pool per operator.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Mapping

from airflow_streambatch.engine.protocol.backend import JobOutcome
from airflow_streambatch.engine.spark.backend import _JobThreads
from airflow_streambatch.engine.spark.connect import worker_environment
from airflow_streambatch.engine.spark.connect_profiles import ConnectProfiles
from airflow_streambatch.engine.spark.profiles import SPARK_RESOURCES_ENV

RESULT_SCHEMA = "result binary"


def _partition_task(op_blob: bytes, groups: list[list[bytes]], env: dict[str, str]):
    """The ``mapInArrow`` function of a launch: partition i runs ``groups[i]``, with ``env`` set
    in its Python worker meanwhile (`connect.worker_environment`); the worker serves other
    sessions' tasks next, so what it had is put back."""

    def run(batches):
        import os

        import pyarrow as pa

        from airflow_streambatch.engine.worker.task_runner import run_partition

        before = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            for batch in batches:
                for index in batch.column(0).to_pylist():
                    results = list(run_partition(op_blob, iter([groups[index]])))
                    yield pa.record_batch([pa.array(results, pa.binary())], names=["result"])
        finally:
            for key, value in before.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    return run


class ConnectBackend:
    """Submits task groups as Spark Connect jobs; outcomes arrive on one queue (a `protocol.backend.Backend`)."""

    def __init__(self, spark, run_tag: str, profiles: ConnectProfiles | None = None):
        self.spark = spark
        self.run_tag = run_tag
        self.profiles = profiles or ConnectProfiles(spark)
        self.outcomes: queue.Queue[JobOutcome] = queue.Queue()
        self._requests: dict[bytes, dict[str, float]] = {}  # operator payload -> its request, for `run_now`
        self._threads = _JobThreads(run_tag)

    def submit(self, launch_id: int, pool: str, op_blob: bytes, groups: list[list[bytes]],
               resources: Mapping[str, float] | None = None) -> None:
        """Run ``groups`` as one job in the background (``pool``: see the module docstring); ``resources``:
        what each task of the operator asks for (``{"CPU": 1}``, ``{"GPU": 1}``)."""
        request = dict(resources or {})
        self._requests[op_blob] = request
        self._threads.submit(self._run_job, launch_id, op_blob, groups, request)

    def close(self) -> None:
        self._threads.close()

    def _collect(self, op_blob: bytes, groups: list[list[bytes]], request: Mapping[str, float]) -> list[bytes]:
        frame = self.spark.range(0, len(groups), 1, len(groups))
        env = dict(worker_environment(self.spark))
        marker = self.profiles.marker(request)
        if marker is not None:
            env[SPARK_RESOURCES_ENV] = marker
        task = _partition_task(op_blob, groups, env)
        rows = frame.mapInArrow(task, RESULT_SCHEMA, profile=self.profiles.profile(request)).collect()
        return [row.result for row in rows]

    def _run_job(self, launch_id: int, op_blob: bytes, groups: list[list[bytes]],
                 request: Mapping[str, float]) -> None:
        start = time.perf_counter()
        tags = (self.run_tag, self._launch_tag(launch_id))
        try:
            for tag in tags:  # Connect's tags belong to the thread that starts the operation
                self.spark.addTag(tag)
            outcome = JobOutcome(launch_id, self._collect(op_blob, groups, request), None,
                                 time.perf_counter() - start)
        except BaseException as exc:  # noqa: BLE001 - reported to the scheduler loop
            outcome = JobOutcome(launch_id, None, exc, time.perf_counter() - start)
        finally:
            try:
                self.spark.clearTags()  # this thread serves other launches next
            except Exception:  # noqa: BLE001 - the session may be stopping
                pass
        self.outcomes.put(outcome)

    def run_now(self, op_blob: bytes, spec_blob: bytes) -> bytes:
        """Run one task as a job in the calling thread (lineage replays)."""
        self.spark.addTag(self.run_tag)
        try:
            return self._collect(op_blob, [[spec_blob]], self._requests.get(op_blob, {}))[0]
        finally:
            self.spark.removeTag(self.run_tag)

    def _launch_tag(self, launch_id: int) -> str:
        return f"{self.run_tag}-launch-{launch_id}"

    def cancel_launch(self, launch_id: int) -> None:
        """Interrupt one job (a timed-out task): Spark kills its tasks and their Python workers."""
        self.spark.interruptTag(self._launch_tag(launch_id))

    def cancel(self) -> None:
        try:
            self.spark.interruptTag(self.run_tag)
        except Exception:  # noqa: BLE001 - best effort on shutdown
            pass
