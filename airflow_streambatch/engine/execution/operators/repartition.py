"""Repartition: a barrier, then one task per output block that re-cuts the rows.

Once all its input is in, the input is cut into ``num_blocks`` row ranges. The
ranges are slices of the input blocks (no data moves in the driver); each becomes
one task that writes one block. An input block is released as soon as every task
that reads a slice of it is done, so a barrier holds its input and little more, not
its input twice. With ``preserve_order`` the input is cut in input order, and output
block ``j`` takes place ``(j,)``.

Before a write, output block ``j`` is also partition ``j``: the partition tracker
relabels the ranges at the cut (`PartitionTracker.relabel_at_barrier`), so the write
commits each output block once, as a partition of its own.
"""

from __future__ import annotations

import math
from collections import deque

from airflow_streambatch.engine.execution.operators.base import Operator
from airflow_streambatch.engine.execution.ordering import Order, min_order
from airflow_streambatch.engine.execution.operators.map import block_task
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.tasks import TaskSpec

NO_CUT = 1 << 62  # repartition tasks emit exactly one block each


class RepartitionOperator(Operator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.groups: deque[tuple[int, list[BlockRef]]] = deque()  # (output index, slices), one task each
        self.barrier_blocks: list[BlockRef] = []  # inputs held until the groups that slice them ran
        self._readers: dict[str, int] = {}  # input block id -> groups slicing it that have not succeeded
        self._sliced_from: dict[str, BlockRef] = {}  # slice id -> the input block it slices

    @property
    def max_block_bytes(self) -> int:
        return NO_CUT

    def block_estimate(self, input_bytes: int = 0) -> int:
        """Its one block holds its input's rows re-cut: their bytes, with room for the Arrow
        buffers (offsets, padding) of the slices it joins. (A full target block was assumed
        before: under a limit of two blocks, W8 #9's repartition tasks waited for grants
        until the stall guard wrote past the limit.)"""
        return input_bytes + input_bytes // 100 + 1024

    def _has_new_work(self) -> bool:
        return bool(self.groups)

    def _pending(self) -> int:
        return len(self.groups) + len(self.inputs)

    def _holding(self) -> bool:
        return bool(self.barrier_blocks)

    def _new_task_input_bytes(self) -> int:
        return sum(ref.size_bytes for ref in self.groups[0][1]) if self.groups else 0

    def _new_task(self) -> TaskSpec:
        index, slices = self.groups.popleft()
        return block_task(slices, order=(index,))

    def min_pending_order(self) -> Order | None:
        """Its output blocks are ``(j,)``: all of them are still to come until the barrier is cut."""
        if not self.upstream_done or self.inputs:
            return (0,)
        return min_order([(j,) for j, _ in self.groups], [spec.order for spec in self.retry_specs])

    def clear_pending(self, flow) -> None:
        self.groups.clear()
        super().clear_pending(flow)

    def _gathered(self) -> list[BlockRef]:
        """The barrier's input, in the order it is cut in."""
        blocks = list(self.inputs)
        if self.ctx.execution_options.preserve_order or self.physical.transforms:  # a seeded shuffle's
            blocks.sort(key=lambda ref: ref.order)
        return blocks

    def _cut(self, blocks: list[BlockRef]) -> tuple[int, list[list[BlockRef]], dict[str, BlockRef]]:
        return cut(blocks, self.physical)

    def advance(self, flow) -> None:
        if self.upstream_done and self.inputs and not self.barrier_blocks:
            self.barrier_blocks = self._gathered()
            self.inputs.clear()
            n, sliced, self._sliced_from = self._cut(self.barrier_blocks)
            groups = [(j, g) for j, g in enumerate(sliced) if g]
            for whole in self._sliced_from.values():
                self._readers[whole.block_id] = self._readers.get(whole.block_id, 0) + 1
            if flow.partitions.barriers_left:  # a write follows: output block j is its partition j
                groups = flow.partitions.relabel_at_barrier(groups, n)
            self.groups.extend(groups)
        if self.barrier_blocks and not self.groups and self.running_tasks == 0:
            for ref in self.barrier_blocks:  # what failed tasks did not free
                flow.release(ref)
            self.barrier_blocks, self._readers, self._sliced_from = [], {}, {}

    def task_done(self, spec: TaskSpec, flow) -> None:
        """Release each input block no group still to run slices (a rerun of a task frees nothing twice)."""
        for piece in spec.inputs:
            whole = self._sliced_from.pop(piece.block_id, None)
            if whole is None:
                continue
            self._readers[whole.block_id] -= 1
            if self._readers[whole.block_id] == 0:
                del self._readers[whole.block_id]
                self.barrier_blocks.remove(whole)
                flow.release(whole)


def cut(blocks: list[BlockRef], physical) -> tuple[int, list[list[BlockRef]], dict[str, BlockRef]]:
    """The number of output blocks, the slices each is made of, and the block each slice is cut from.

    ``num_blocks``: near-equal row ranges of the whole input (Ray's ``shuffle=False``).
    ``shuffle``: every input block is cut into ``num_blocks`` slices of ``ceil(rows / num_blocks)``
    rows and output block ``j`` joins the ``j``-th slice of each, as Ray's shuffling repartition
    splits its map outputs (so a few output blocks may be empty). ``rows_per_block``: blocks of
    exactly that many rows, the last holding the rest (Ray's ``target_num_rows_per_block``).
    """
    total = sum(ref.num_rows for ref in blocks)
    if physical.rows_per_block is not None:
        n = max(1, math.ceil(total / physical.rows_per_block))
        return n, *slice_rows(blocks, [min(total, i * physical.rows_per_block) for i in range(n + 1)])
    if physical.by_group:
        return _by_group(blocks)
    n = physical.num_blocks or max(1, len(blocks))  # None: one output block per input block (random_shuffle)
    if not physical.shuffle:
        return n, *slice_rows(blocks, [round(i * total / n) for i in range(n + 1)])
    groups: list[list[BlockRef]] = [[] for _ in range(n)]
    sliced_from: dict[str, BlockRef] = {}
    for ref in blocks:
        size = max(1, math.ceil(ref.num_rows / n))
        for j in range(n):
            start = j * size
            if start < ref.num_rows:
                piece = ref.slice(start, min(size, ref.num_rows - start))
                groups[j].append(piece)
                sliced_from[piece.block_id] = ref
    return n, groups, sliced_from


def _by_group(blocks: list[BlockRef]) -> tuple[int, list[list[BlockRef]], dict[str, BlockRef]]:
    """Output block ``j`` joins, in order, every input block placed ``(j, ...)`` (a zip's slices)."""
    n = max((ref.order[0] + 1 for ref in blocks), default=1)
    groups: list[list[BlockRef]] = [[] for _ in range(n)]
    sliced_from: dict[str, BlockRef] = {}
    for ref in sorted(blocks, key=lambda ref: ref.order):
        piece = ref.slice(0, ref.num_rows)
        groups[ref.order[0]].append(piece)
        sliced_from[piece.block_id] = ref
    return n, groups, sliced_from


def slice_rows(blocks: list[BlockRef], bounds: list[int]) -> tuple[list[list[BlockRef]], dict[str, BlockRef]]:
    """For each output range [bounds[i], bounds[i+1]), the block slices that cover it; and
    the block each slice is cut from, by slice id."""
    groups: list[list[BlockRef]] = [[] for _ in bounds[:-1]]
    sliced_from: dict[str, BlockRef] = {}
    start = 0
    for ref in blocks:
        end = start + ref.num_rows
        for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            a, b = max(lo, start), min(hi, end)
            if a < b:
                piece = ref.slice(a - start, b - a)
                groups[i].append(piece)
                sliced_from[piece.block_id] = ref
        start = end
    return groups, sliced_from
