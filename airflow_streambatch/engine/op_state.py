"""Driver-side state of one physical operator: its queue, estimates and statistics.

`OpState` implements the narrow `OpView` protocol the scheduling policies read
(`has_input`, `running`, output estimates, usable slots, buffered output) and owns
the bundling rule: consecutive input blocks are coalesced into a task until they
reach ``target_min_block_size`` (and the first transform's ``batch_size`` in rows),
never past ``target_max_block_size``, and never across input partitions when the
run commits or isolates failures per partition.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque

from airflow_streambatch.engine.blocks import BlockRef
from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.plan import PhysicalOp
from airflow_streambatch.engine.resources import TASK_SLOTS, ResourcePool
from airflow_streambatch.engine.scheduler import Estimates
from airflow_streambatch.engine.spark_backend import GroupSizer
from airflow_streambatch.engine.stats import OpStats
from airflow_streambatch.engine.tasks import TaskSpec
from airflow_streambatch.engine.transforms import MapBatches


class OpState:
    """Driver-side state of one physical operator (implements the policy's `OpView`)."""

    def __init__(self, index: int, op: PhysicalOp, ctx: DataContext, pool: ResourcePool):
        self.index = index
        self.op = op
        self.is_source = index == 0
        self.pool = pool
        self.ctx = ctx
        self.inputs: deque[BlockRef] = deque()
        self.retry_specs: deque[TaskSpec] = deque()  # failed tasks to run again, first
        self.pending_reads: deque[tuple[int, object]] = deque()
        self.upstream_done = False
        self.running_tasks = 0
        self.buffered_output_bytes = 0
        self.estimates = Estimates()
        self.stats = OpStats(op.name)
        self.sizer = GroupSizer(ctx.scheduling_overhead_bound, ctx.max_group_size, ctx.group_scheduling)
        # Coalescing blocks of different input partitions into one task is allowed only
        # where nothing is committed or isolated per partition (set by the executor).
        self.mix_partitions = False
        self.rows_seen = 0  # limit: rows passed on so far
        self.cut = False  # upstream of a satisfied limit: launch nothing, drop outputs
        self.largest_block = 0  # bytes of the largest block this operator has written
        self.downstream: list[OpState] = []  # downstream operators that run tasks (set by the executor)
        self.groups: deque[list[BlockRef]] = deque()  # repartition: slice groups, one per task
        self.barrier_blocks: list[BlockRef] = []  # repartition: inputs held until all groups ran
        first = op.transforms[0] if op.transforms else None
        self.min_rows = first.batch_size if isinstance(first, MapBatches) and first.batch_size else 0

    # -- the OpView protocol --------------------------------------------------
    def running(self) -> int:
        return self.running_tasks

    def has_input(self) -> bool:
        if self.cut:
            return False
        if self.retry_specs:
            return True
        if self.op.kind == "read":
            return bool(self.pending_reads)
        if self.op.kind == "repartition":
            return bool(self.groups)
        return bool(self.inputs) and (self.upstream_done or self._bundle_ready())

    def next_task_input_bytes(self) -> int:
        if self.retry_specs:
            return sum(ref.size_bytes for ref in self.retry_specs[0].inputs)
        if self.op.kind == "read":
            return 0
        return sum(ref.size_bytes for ref in self._peek_bundle())

    def next_task_output_estimate(self, pessimistic: bool = False) -> float:
        if self.op.kind == "read":
            read_bytes = self.pending_reads[0][1].estimated_bytes if self.pending_reads else 0
            if not self.estimates.known:
                return float(read_bytes)
            return self.estimates.output_for_input(0, pessimistic)
        return self.estimates.output_for_input(self.next_task_input_bytes(), pessimistic)

    def block_estimate(self, input_bytes: int = 0) -> int:
        """Bytes of the next block this operator writes: its largest so far, or before any,
        the task's input size (output as large as input), at most the target."""
        target = self.ctx.target_max_block_size
        return min(target, self.largest_block or input_bytes or target)

    def ready_tasks(self) -> int:
        """About how many tasks could start now (blocks stand in for bundles)."""
        return len(self.retry_specs) + len(self.pending_reads) + len(self.groups) + len(self.inputs)

    def usable_slots(self) -> int:
        """Free slots, leaving one task's resources (and a Spark task slot) to each
        downstream operator that runs nothing and has input queued: the consumer of
        this operator's blocks must be able to start, or memory never drains (Ray Data
        reserves resources per operator for the same reason). A consumer with nothing
        queued keeps nothing: W4's embedding ran on one of two CPU slots while the other
        was kept for a write that needed 1 s in all. Slots already held by tasks that
        wait for memory are taken back by preemption (the executor's `_preempt`)."""
        keep: dict[str, float] = {}
        for op in self.downstream:
            if op.running_tasks == 0 and not op.done and op.queued():
                for name, amount in op.op.compute.resources:
                    keep[name] = keep.get(name, 0.0) + amount
                keep[TASK_SLOTS] = keep.get(TASK_SLOTS, 0.0) + 1
        return self.pool.slots_for(self.index, self.op.compute, keep)

    def queued(self) -> bool:
        """Work is waiting for a slot (input blocks, repartition groups, retries)."""
        return bool(self.inputs or self.groups or self.retry_specs or self.pending_reads)

    @property
    def done(self) -> bool:
        idle = not (self.inputs or self.pending_reads or self.groups or self.barrier_blocks or self.retry_specs)
        return self.upstream_done and idle and self.running_tasks == 0

    # -- bundling (coalescing small blocks) ------------------------------------
    def _blocks_per_task_cap(self) -> int:
        """Coalesce no more blocks per task than keeps every free slot busy: bundling
        small blocks saves per-task overhead only when there is a backlog. (W2 once
        bundled four tiny read blocks into one task and ran an expanding stage serially.)"""
        return max(1, math.ceil(len(self.inputs) / max(1, self.usable_slots())))

    def _peek_bundle(self) -> list[BlockRef]:
        if self.op.kind == "repartition":
            return self.groups[0] if self.groups else []
        cap = self._blocks_per_task_cap()
        bundle, size, rows = [], 0, 0
        for ref in self.inputs:
            too_big = size + ref.size_bytes > self.ctx.target_max_block_size
            if bundle and (too_big or (not self.mix_partitions and ref.partitions != bundle[0].partitions)):
                break  # full, or another input partition where partitions must stay apart
            if bundle and rows >= self.min_rows and len(bundle) >= cap:
                break
            bundle.append(ref)
            size += ref.size_bytes
            rows += ref.num_rows
            if size >= self.ctx.target_min_block_size and rows >= self.min_rows:
                break
        return bundle

    def _bundle_ready(self) -> bool:
        """A bundle may start when it is big enough (bytes, or the slot cap) and has the
        first transform's ``batch_size`` rows, or when no more input can join it."""
        bundle = self._peek_bundle()
        size = sum(r.size_bytes for r in bundle)
        rows = sum(r.num_rows for r in bundle)
        big_enough = size >= self.ctx.target_min_block_size or len(bundle) >= self._blocks_per_task_cap()
        return (big_enough and rows >= self.min_rows) or len(bundle) < len(self.inputs)

    def take_bundle(self) -> list[BlockRef]:
        if self.op.kind == "repartition":
            return self.groups.popleft()
        bundle = self._peek_bundle()
        for _ in bundle:
            self.inputs.popleft()
        return bundle


def task_key(inputs: list[BlockRef]) -> str:
    return hashlib.sha1(",".join(ref.block_id for ref in inputs).encode()).hexdigest()[:16]
