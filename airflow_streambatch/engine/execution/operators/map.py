"""Map: runs its fused transforms over bundles of input blocks.

The bundling rule: consecutive input blocks are coalesced into a task until they
reach ``target_min_block_size`` (and the first transform's ``batch_size`` in rows),
never past ``target_max_block_size``, and never across input partitions when the
run commits or isolates failures per partition. With ``preserve_order`` the queue is
taken in input order, and a task bundles only blocks that nothing can fall between:
blocks that follow each other in one upstream task's output, or any two once no work
pending upstream could still produce a block placed between them and no task of this
operator took one.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import deque

from airflow_streambatch.engine.execution.operators.base import Operator
from airflow_streambatch.engine.execution.ordering import Order
from airflow_streambatch.engine.plan.logical import MapBatches
from airflow_streambatch.engine.worker.blocks import BlockRef
from airflow_streambatch.engine.worker.task_runner import TaskSpec


def task_key(inputs: list[BlockRef]) -> str:
    """A task's stable key: the same inputs make the same task, in every attempt."""
    return hashlib.sha1(",".join(ref.block_id for ref in inputs).encode()).hexdigest()[:16]


def block_task(inputs: list[BlockRef], order: tuple[int, ...] | None = None) -> TaskSpec:
    """The task that runs over ``inputs``, descending from their input partitions; its output
    takes the place in input order of its first input, unless ``order`` says otherwise."""
    partitions = tuple(sorted({p for ref in inputs for p in ref.partitions}))
    order = order if order is not None else (inputs[0].order if inputs else ())
    return TaskSpec(task_key=task_key(inputs), partitions=partitions, inputs=inputs, order=order)


class MapOperator(Operator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Coalescing blocks of different input partitions into one task is allowed only
        # where nothing is committed or isolated per partition (set by the executor).
        self.mix_partitions = False
        first = self.physical.transforms[0] if self.physical.transforms else None
        self.min_rows = first.batch_size if isinstance(first, MapBatches) and first.batch_size else 0
        self.ordered = self.ctx.execution_options.preserve_order
        # preserve_order: the smallest place of work pending upstream, set by the flow each turn
        # (None: nothing pending; () until first set, which bundles nothing but siblings)
        self.upstream_frontier: Order | None = ()
        self._taken: list[Order] = []  # preserve_order: places of the blocks its tasks took, sorted

    def _has_new_work(self) -> bool:
        return bool(self.inputs) and (self.upstream_done or self._bundle_ready())

    def _new_task_input_bytes(self) -> int:
        return sum(ref.size_bytes for ref in self._peek_bundle())

    def _new_task(self) -> TaskSpec:
        bundle = self._peek_bundle()
        for ref in bundle:
            self.inputs.popleft()
            if self.ordered:
                bisect.insort(self._taken, ref.order)
        return block_task(bundle)

    def _blocks_per_task_cap(self) -> int:
        """Coalesce no more blocks per task than keeps every free slot busy: bundling
        small blocks saves per-task overhead only when there is a backlog. (W2 once
        bundled four tiny read blocks into one task and ran an expanding stage serially.)"""
        return max(1, math.ceil(len(self.inputs) / max(1, self.usable_slots())))

    def _peek_bundle(self) -> list[BlockRef]:
        cap = self._blocks_per_task_cap()
        if self.ordered:
            self.inputs = deque(sorted(self.inputs, key=lambda ref: ref.order))
        bundle, size, rows = [], 0, 0
        for ref in self.inputs:
            too_big = size + ref.size_bytes > self.ctx.target_max_block_size
            if bundle and (too_big or (not self.mix_partitions and ref.partitions != bundle[0].partitions)):
                break  # full, or another input partition where partitions must stay apart
            if bundle and self.ordered and not self._adjacent(bundle[-1], ref):
                break  # a block still to come could fall between them
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


    def _adjacent(self, previous: BlockRef, ref: BlockRef) -> bool:
        """Whether no block falls between ``previous`` and ``ref`` (the queue is sorted): none pending
        upstream (`upstream_frontier`), and none already taken by another task of this operator."""
        if _next_of(previous, ref):
            return True
        frontier = self.upstream_frontier
        if frontier == () or (frontier is not None and frontier < ref.order):
            return False
        later = bisect.bisect_right(self._taken, previous.order)
        return later == len(self._taken) or self._taken[later] > ref.order


def _next_of(previous: BlockRef, ref: BlockRef) -> bool:
    """Whether ``ref`` is the block right after ``previous`` in one task's output."""
    return (len(ref.order) == len(previous.order) > 0 and ref.order[:-1] == previous.order[:-1]
            and ref.order[-1] == previous.order[-1] + 1)
