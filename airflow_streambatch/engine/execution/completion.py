"""What a finished Spark job means: outputs passed on, retries, failed partitions, lost inputs.

A task that raised is retried up to ``max_task_retries`` times, then its input
partitions fail: their queued work is dropped and they are never committed (a run
fails once more than ``max_failed_partitions`` have). A job that failed as a whole
(a worker crashed, an executor was lost, a timeout) with several tasks in it reruns
each task alone, charging none a try, to find the one at fault. A task whose input
files vanished has them rebuilt by lineage, then runs again.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.errors import PartitionFailure, StreamBatchError, partitions_failed
from airflow_streambatch.engine.execution.block_access import BlockAccess
from airflow_streambatch.engine.execution.failures import (
    disk_full_error,
    job_failure_message,
    load_exception,
    root_cause,
)
from airflow_streambatch.engine.execution.flow import BlockFlow
from airflow_streambatch.engine.execution.launcher import Launcher
from airflow_streambatch.engine.execution.lineage import LineageTable
from airflow_streambatch.engine.execution.memory import MemoryGrants
from airflow_streambatch.engine.execution.operators import Operator
from airflow_streambatch.engine.execution.partitions import PartitionTracker
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.tasks import TaskResult, TaskSpec

log = logging.getLogger("airflow_streambatch.engine.progress")

MAX_INPUT_REBUILDS = 3  # a task whose inputs keep vanishing fails the run


class Completions:
    def __init__(self, ctx: DataContext, flow: BlockFlow, partitions: PartitionTracker, lineage: LineageTable,
                 launcher: Launcher, grants: MemoryGrants, blocks: BlockAccess):
        self.ctx = ctx
        self.flow = flow
        self.partitions = partitions
        self.lineage = lineage
        self.launcher = launcher
        self.grants = grants
        self.blocks = blocks
        self._attempts: dict[tuple[int, str], int] = {}  # (operator, task key) -> failed runs

    def tasks_ended(self, op: Operator, specs: list[TaskSpec], results: list[TaskResult] | None,
                    error: BaseException | None = None, timed_out: bool = False) -> None:
        """Tasks ``specs`` of ``op`` ended: with ``results`` (a check-in, or their job's), or,
        when ``results`` is None, in a Spark job that failed with ``error``."""
        if not specs:
            return
        if results is None:  # a worker crashed, an executor was lost, or the job timed out
            if len(specs) > 1:  # which task is at fault is unknown: run each alone, charging none a try
                log.warning("%s: a Spark job of %d tasks failed (%s); running each task alone to find the one at "
                            "fault", op.name, len(specs), root_cause(error))
                op.retry_specs.extend(replace(spec, alone=True) for spec in specs)
                op.stats.retried(len(specs))
                return
            message = job_failure_message(error, op.name, specs[0].partitions,
                                          self.ctx.task_timeout_s if timed_out else None)
            self._failed(op, specs[0], message, str(error))
            return
        for spec, result in zip(specs, results):
            if result.yielded:  # gave its slot back while waiting for memory: runs again, charged nothing
                op.retry_specs.append(spec)
                op.stats.retried()
            elif result.no_space is not None:
                raise disk_full_error(result.no_space, self.ctx, op.name, spec.partitions)
            elif result.lost_inputs:
                self._recover_inputs(op, spec, result.lost_inputs)
            elif result.error is not None:
                self._failed(op, spec, result.error, result.error_traceback, result.exception)
            else:
                self._succeeded(op, spec, result)
        self.flow.propagate_done()

    def _succeeded(self, op: Operator, spec: TaskSpec, result: TaskResult) -> None:
        op.estimates.observe(result.work_s, result.input_bytes, result.output_bytes,
                             sum(ref.num_rows for ref in spec.inputs))
        op.stats.fetched_bytes += result.fetched_bytes
        op.stats.task_done(result)
        self.lineage.register(op.name, self.launcher.payload(op), spec.for_replay(), result.blocks)
        self.partitions.add_files(spec.partitions, result.files)
        self.partitions.add_quarantined(spec.partitions, result.quarantined)
        streamed = self.grants.take_delivered(op.index, spec.task_key)
        for ref in result.blocks:
            if ref.block_id not in streamed:
                self.flow.emit(op, ref)
        for ref in spec.inputs:
            self.flow.release(ref)
        op.task_done(spec, self.flow)
        if spec.read_task is not None:
            self.partitions.read_done(spec.partitions[0])

    def _failed(self, op: Operator, spec: TaskSpec, error: str, remote_traceback: str,
                exception: bytes | None = None) -> None:
        """Retry a failed task up to ``max_task_retries`` times, then fail its input partition."""
        key = (op.index, spec.task_key)
        self._attempts[key] = self._attempts.get(key, 0) + 1
        retries = op_retries(op, self.ctx.max_task_retries)
        if (retries == -1 or self._attempts[key] <= retries) and not self.partitions.is_failed(spec.partitions):
            log.warning("%s: task %s (input partitions %s) failed, retry %d of %s: %s", op.name, spec.task_key,
                        spec.partitions, self._attempts[key], "unlimited" if retries == -1 else retries, error)
            op.retry_specs.append(spec)
            op.stats.retried()
            return
        # fail the partitions before releasing the task's inputs: a partition whose last
        # block is released is committed, and a failed one must never be
        for p in spec.partitions:
            self.partitions.fail(PartitionFailure(p, self.partitions.label(p), op.name, error, remote_traceback,
                                                  load_exception(exception)))
        for ref in spec.inputs:
            self.flow.release(ref)
        self.grants.take_delivered(*key)
        for p in spec.partitions:
            self.flow.drop_partition(p)
        self.check_failures()

    def check_failures(self) -> None:
        failures = list(self.partitions.failures.values())
        if len(failures) > self.ctx.max_failed_partitions:
            raise partitions_failed(failures, self.ctx.max_failed_partitions)

    def rebuild(self, ref: BlockRef) -> None:
        """Recreate a lost block by replaying the task that made it (`lineage.py`), each as its own Spark job."""
        self.lineage.rebuild(ref, self.launcher.run_now, self.flow.holds, self.blocks)

    def _recover_inputs(self, op: Operator, spec: TaskSpec, lost: list[str]) -> None:
        """Inputs of ``spec`` vanished: rebuild them by lineage, then run the task again."""
        key = (op.index, f"lost:{spec.task_key}")
        self._attempts[key] = self._attempts.get(key, 0) + 1
        if self._attempts[key] > MAX_INPUT_REBUILDS:
            raise StreamBatchError(f"{op.name}: inputs of task {spec.task_key} keep disappearing: {lost}")
        for ref in spec.inputs:
            if ref.block_id in lost:
                self.rebuild(ref)
        op.retry_specs.append(spec)
        op.stats.retried()


def op_retries(op: Operator, default: int) -> int:
    """The retries of ``op``'s failed tasks: its transforms' own (Ray's ``max_task_retries`` on a map,
    the most of those fused into it; -1: no limit), else ``default`` (``DataContext.max_task_retries``)."""
    own = [t.max_task_retries for t in getattr(op.physical, "transforms", ()) if t.max_task_retries is not None]
    if not own:
        return default
    return -1 if -1 in own else max(own)
