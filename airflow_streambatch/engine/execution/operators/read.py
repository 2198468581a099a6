"""Read: the source that launches one read task per input partition.

Partitions an earlier run committed from the same input are skipped (a resumed
write); the rest are registered with the partition tracker, which commits each
once all of its blocks have left the pipeline.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque

from airflow_streambatch.engine.output.commit import check_resumable
from airflow_streambatch.engine.execution.operators.base import Operator
from airflow_streambatch.engine.execution.ordering import min_order
from airflow_streambatch.engine.protocol.tasks import TaskSpec

log = logging.getLogger(__name__)


class ReadOperator(Operator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pending_reads: deque[tuple[int, object]] = deque()  # (input partition, ReadTask)

    def start(self, flow, partitions, committer, skipped: dict) -> None:
        """Plan the read tasks; queue those whose partition is not committed yet."""
        read = self.physical.read
        # as many tasks as the slots take; a concurrency cap limits how many run at once, not how many (as Ray's)
        slots = max(1, self.pool.slots_for(0, dataclasses.replace(self.compute, concurrency=None)))
        tasks = read.datasource.plan(slots, read.override_num_blocks, self.ctx.target_max_block_size)
        warn_if_too_parallel(read.override_num_blocks, len(tasks), slots)
        done = committer.committed() if committer else {}
        if committer is not None:
            committer.set_reference_schema(committer.scan())
        for index, task in enumerate(tasks):
            record = done.get(index)
            if record is None:
                self.pending_reads.append((index, task))
                partitions.add_read(index, task.label, task.identity)
            else:
                check_resumable(committer.path, index, record, task)
                skipped[index] = record  # committed by an earlier run from the same input
        self.estimates.initial_output_bytes = sum(t.estimated_bytes for t in tasks) / max(1, len(tasks))
        self.upstream_done = True

    def _has_new_work(self) -> bool:
        return bool(self.pending_reads)

    def _pending(self) -> int:
        return len(self.pending_reads)

    def _new_task(self) -> TaskSpec:
        index, read_task = self.pending_reads.popleft()
        return TaskSpec(task_key=f"p{index:05d}", partitions=(index,), read_task=read_task, order=(index,))

    def next_task_output_estimate(self, pessimistic: bool = False) -> float:
        if self.probing:
            return float(self.pending_reads[0][1].estimated_bytes if self.pending_reads else 0)
        return self.estimates.output_for_input(0, pessimistic)

    def min_pending_order(self):
        first = [(self.pending_reads[0][0],)] if self.pending_reads else []
        return min_order(first, [spec.order for spec in self.retry_specs])

    def clear_pending(self, flow) -> None:
        self.pending_reads.clear()
        super().clear_pending(flow)

    def drop_partition(self, partition: int) -> list:
        self.pending_reads = deque((i, t) for i, t in self.pending_reads if i != partition)
        return super().drop_partition(partition)


def warn_if_too_parallel(requested: int | None, num_tasks: int, cpu_slots: int) -> None:
    """Ray's warning, in its words, when a requested number of blocks (``override_num_blocks``,
    ``parallelism``) makes at least 5000 read tasks and more than 4x the CPU slots: each task
    costs scheduling, so most of the run would be overhead. Only a requested number: the
    engine's own choice is sized to the slots."""
    if requested and num_tasks >= 5000 and num_tasks > cpu_slots * 4:
        log.warning("The requested parallelism of %d is more than 4x the number of available CPU slots in the "
                    "cluster of %d. This can lead to slowdowns during the data reading phase due to excessive "
                    "task creation. Reduce the parallelism (override_num_blocks) to match the CPU slots, or leave "
                    "it unset for the engine to choose.", requested, cpu_slots)
