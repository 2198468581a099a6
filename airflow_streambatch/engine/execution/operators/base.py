"""Driver-side state of one physical operator: its queue, estimates and statistics.

`Operator` implements the narrow `OpView` protocol the scheduling policies read
(`has_input`, `running`, output estimates, usable slots, buffered output). Each kind
of physical operator is a subclass that says what its new work is (`_has_new_work`,
`_new_task`), how it takes a block from upstream (`accept`), and what it does when
its upstream is done (`advance`); retries, slots and statistics are common.
"""

from __future__ import annotations

from collections import deque

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.execution.estimates import Estimates
from airflow_streambatch.engine.execution.ordering import Order, min_order
from airflow_streambatch.engine.execution.resources import TASK_SLOTS, ResourcePool
from airflow_streambatch.engine.execution.stats import OpStats
from airflow_streambatch.engine.plan.planner import PhysicalOp
from airflow_streambatch.engine.spark.group_sizer import GroupSizer
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.tasks import TaskSpec


class Operator:
    """Driver-side state of one physical operator (implements the policy's `OpView`)."""

    def __init__(self, index: int, physical: PhysicalOp, ctx: DataContext, pool: ResourcePool):
        self.index = index
        self.physical = physical
        self.name = physical.name
        self.compute = physical.compute
        self.runs_tasks = physical.runs_tasks
        self.is_source = index == 0
        self.pool = pool
        self.ctx = ctx
        self.inputs: deque[BlockRef] = deque()
        self.retry_specs: deque[TaskSpec] = deque()  # failed tasks to run again, first
        self.upstream_done = False
        self.running_tasks = 0
        self.buffered_output_bytes = 0
        self.estimates = Estimates()
        self.stats = OpStats(physical.name)
        self.sizer = GroupSizer(ctx.scheduling_overhead_bound, ctx.max_group_size, ctx.group_scheduling)
        self.cut = False  # upstream of a satisfied limit: launch nothing, drop outputs
        self.largest_block = 0  # bytes of the largest block this operator has written
        self.downstream: list[Operator] = []  # downstream operators that run tasks (set by the executor)

    # -- counters, changed by the launcher and the ledger ---------------------------
    def tasks_started(self, n: int = 1) -> None:
        """``n`` of its tasks were handed to a Spark partition."""
        self.running_tasks += n
        self.stats.launched(n)

    def tasks_returned(self, n: int) -> None:
        """``n`` of its tasks ran or were taken back: their slots are free again."""
        self.running_tasks -= n

    def output_added(self, nbytes: int) -> None:
        """A block of ``nbytes`` it produced entered the ledger: it counts against memory until released."""
        self.largest_block = max(self.largest_block, nbytes)
        self.buffered_output_bytes += nbytes
        self.stats.buffered(self.buffered_output_bytes)

    def output_freed(self, nbytes: int) -> None:
        self.buffered_output_bytes -= nbytes

    # -- what each kind defines --------------------------------------------------
    def _has_new_work(self) -> bool:
        return False

    def _new_task(self) -> TaskSpec:
        raise NotImplementedError(f"{type(self).__name__} runs no tasks")

    def _new_task_input_bytes(self) -> int:
        return 0

    def _pending(self) -> int:
        """New tasks (or blocks standing in for them) waiting, besides retries."""
        return len(self.inputs)

    def _holding(self) -> bool:
        """Blocks held beyond the queue (a repartition's barrier)."""
        return False

    def accept(self, ref: BlockRef, flow) -> None:
        """A block from upstream: queue it for this operator's tasks."""
        flow.queue(self, ref)

    def advance(self, flow) -> None:
        """Called every turn of the loop, after upstream completion propagated."""

    def task_done(self, spec: TaskSpec, flow) -> None:
        """A task of this operator succeeded and its inputs were released."""

    def clear_pending(self, flow) -> None:
        """Upstream of a satisfied limit: drop queued work."""
        while self.inputs:
            flow.release(self.inputs.popleft())

    def min_pending_order(self) -> Order | None:
        """The smallest place in input order of the work queued here (`ordering.py`); None: none."""
        return min_order([ref.order for ref in self.inputs], [spec.order for spec in self.retry_specs])

    def drop_partition(self, partition: int) -> list[BlockRef]:
        """A failed partition: remove its queued work; returns the blocks to release."""
        dropped = [ref for ref in self.inputs if partition in ref.partitions]
        dropped += [ref for spec in self.retry_specs if partition in spec.partitions for ref in spec.inputs]
        self.inputs = deque(ref for ref in self.inputs if partition not in ref.partitions)
        self.retry_specs = deque(spec for spec in self.retry_specs if partition not in spec.partitions)
        return dropped

    @property
    def max_block_bytes(self) -> int:
        """Where a task of this operator cuts its output into blocks."""
        return self.ctx.target_max_block_size

    # -- the OpView protocol ------------------------------------------------------
    @property
    def probing(self) -> bool:
        """No task finished yet, so the output size is unknown: a probe runs alone."""
        return not self.estimates.known

    def running(self) -> int:
        return self.running_tasks

    def has_input(self) -> bool:
        return not self.cut and (bool(self.retry_specs) or self._has_new_work())

    def next_task_input_bytes(self) -> int:
        if self.retry_specs:
            return sum(ref.size_bytes for ref in self.retry_specs[0].inputs)
        return self._new_task_input_bytes()

    def next_task_output_estimate(self, pessimistic: bool = False) -> float:
        return self.estimates.output_for_input(self.next_task_input_bytes(), pessimistic)

    def usable_slots(self) -> int:
        """Free slots, leaving one task's resources (and a Spark task slot) to each
        downstream operator that runs nothing and could start a task now: the consumer of
        this operator's blocks must be able to start, or memory never drains (Ray Data
        reserves resources per operator for the same reason). A consumer that cannot start
        keeps nothing: W4's embedding ran on one of two CPU slots while the other was kept
        for a write that needed 1 s in all, and with one CPU slot a repartition waiting for
        the rest of its input kept the only slot from the source that had to produce it
        (W8 hung). Slots already held by tasks that wait for memory are taken back by
        preemption (`liveness.Liveness.preempt`)."""
        keep: dict[str, float] = {}
        for op in self.downstream:
            if op.running_tasks == 0 and not op.done and op.has_input():
                for name, amount in op.compute.resources:
                    keep[name] = keep.get(name, 0.0) + amount
                keep[TASK_SLOTS] = keep.get(TASK_SLOTS, 0.0) + 1
        return self.pool.slots_for(self.index, self.compute, keep)

    # -- common -------------------------------------------------------------------
    def block_estimate(self, input_bytes: int = 0) -> int:
        """Bytes of the next block this operator writes: its largest so far, or before any, the
        target. (The task's input size was used before any block: a task of 1 KiB of input then
        wrote thousands of 2 MiB blocks without asking, carrying W8 runs to 3x their limit.)"""
        target = self.ctx.target_max_block_size
        return min(target, self.largest_block or target)

    def ready_tasks(self) -> int:
        """About how many tasks could start now (blocks stand in for bundles)."""
        return len(self.retry_specs) + self._pending()

    def queued(self) -> bool:
        """Work is waiting for a slot (input blocks, repartition groups, retries)."""
        return bool(self.retry_specs) or self._pending() > 0

    def next_task(self) -> TaskSpec:
        return self.retry_specs.popleft() if self.retry_specs else self._new_task()

    @property
    def done(self) -> bool:
        return self.upstream_done and not self.queued() and not self._holding() and self.running_tasks == 0
