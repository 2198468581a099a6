"""A backend that runs each job's partitions in threads of the test's own process.

Not Spark, and never offered as Spark: the scheduler loop's tests use it to check
scheduling, grants, retries, lineage and liveness in milliseconds. Everything but the
job launcher is the real thing: each partition calls the `run_partition` Spark's
Python workers call, with the same pickled payload and specs, and talks to the real
control server (check-ins, output streams, grants); blocks are real Arrow files.

What it cannot do as Spark does: kill a running task. A cancelled job's partitions
finish what they run, and its outcome then reports the cancel; so a timeout test runs
without group scheduling, where results travel with the job's outcome, not check-ins.
As in Spark, a partition that raises ends its job at once: the outcome reports the
error while the job's other partitions still run, and may check in after it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.execution.control_server import control_server
from airflow_streambatch.engine.execution.executor import DONE, StreamingExecutor
from airflow_streambatch.engine.execution.resources import ResourcePool
from airflow_streambatch.engine.execution.runtime import Runtime
from airflow_streambatch.engine.plan.planner import plan
from airflow_streambatch.engine.plan.row_errors import with_dead_letters
from airflow_streambatch.engine.protocol.backend import JobOutcome
from airflow_streambatch.engine.worker.task_runner import run_partition


class JobCancelled(RuntimeError):
    """What a cancelled job's outcome reports (Spark's says the job was cancelled, too)."""


class InProcessBackend:
    def __init__(self, tag: str):
        self.tag = tag
        self.outcomes: queue.Queue = queue.Queue()
        self.jobs: list[tuple[str, int]] = []  # (pool, partitions) per submitted job
        self.replays = 0  # tasks run by `run_now` (lineage)
        self._cancelled: set[int] = set()
        self._all_cancelled = False

    def submit(self, launch_id: int, pool: str, op_blob: bytes, groups: list[list[bytes]],
               resources: Mapping[str, float] | None = None) -> None:
        self.jobs.append((pool, len(groups)))
        threading.Thread(target=self._job, args=(launch_id, op_blob, groups), daemon=True,
                         name=f"{self.tag}-job-{launch_id}").start()

    def _job(self, launch_id: int, op_blob: bytes, groups: list[list[bytes]]) -> None:
        start = time.perf_counter()
        results: list[list[bytes]] = [[] for _ in groups]
        errors: list[BaseException] = []

        ended = threading.Semaphore(0)

        def partition(index: int) -> None:
            try:
                results[index] = list(run_partition(op_blob, iter([groups[index]])))
            except BaseException as exc:  # noqa: BLE001 - reported as the job's error, as Spark does
                errors.append(exc)
            finally:
                ended.release()

        threads = [threading.Thread(target=partition, args=(i,), daemon=True) for i in range(len(groups))]
        for thread in threads:
            thread.start()
        for _ in threads:  # Spark aborts a job at its first failed task: the others run on, unreported
            ended.acquire()
            if errors:
                break
        error = JobCancelled(f"job {launch_id} was cancelled") if (
            self._all_cancelled or launch_id in self._cancelled) else (errors[0] if errors else None)
        flat = None if error is not None else [blob for part in results for blob in part]
        self.outcomes.put(JobOutcome(launch_id, flat, error, time.perf_counter() - start))

    def run_now(self, op_blob: bytes, spec_blob: bytes) -> bytes:
        self.replays += 1
        return next(run_partition(op_blob, iter([[spec_blob]])))

    def cancel_launch(self, launch_id: int) -> None:
        self._cancelled.add(launch_id)

    def cancel(self) -> None:
        self._all_cancelled = True

    def close(self) -> None:
        pass


def run_in_process(ds, slots: int = 2, before_read=None, started=None,
                   resources: dict[str, float] | None = None) -> tuple[list[dict], StreamingExecutor]:
    """Run ``ds`` as `Dataset` does, on `InProcessBackend` with ``slots`` CPU slots (``resources``:
    these slots instead, ``slots`` then counting Spark task slots): its rows in arrival order,
    and the executor (its ``parts``, ``stats`` and backend) once it ended.
    ``before_read(ref)`` is called with each output block before the consumer reads it, ``started(executor)``
    once the run started."""
    ctx: DataContext = ds.context
    executor = StreamingExecutor(plan(with_dead_letters(list(ds._logical), ctx.on_row_error),
                                      ctx.enable_operator_fusion), ctx)
    runtime = Runtime(control_server(None, ctx), ResourcePool(resources or {"CPU": slots}, task_slots=slots),
                      host_agents=False, backend=InProcessBackend)
    executor.start(runtime)
    if started is not None:
        started(executor)
    rows: list[dict] = []
    try:
        while (item := executor.outputs.get(timeout=60)) is not DONE:
            if isinstance(item, BaseException):
                raise item
            if before_read is not None:
                before_read(item)
            rows += executor.read_output(item).to_pylist()
            executor.release(item)
    finally:
        executor.shutdown()
        executor.join()
        executor.cleanup()
    return rows, executor
