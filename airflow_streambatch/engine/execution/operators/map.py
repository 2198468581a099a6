"""Map: runs its fused transforms over bundles of input blocks.

How many blocks a task takes is decided by cost, from the operator's own estimates
(`Estimates.for_input`: seconds of work and output bytes per input row and byte):

* before any task of the operator finished, one block per task;
* a task grows while the bundle is *cheap*: its expected work is under one Spark job's
  overhead (`GroupSizer.job_overhead_s`, measured; ``DEFAULT_JOB_OVERHEAD_S`` before
  that), its expected output under ``target_max_block_size`` and its input under
  ``target_min_block_size``. A block that is already expensive, or whose output fills a
  block, runs alone. Group scheduling then packs the cheap tasks several to a Spark job,
  so the two never fight: bundling stops where a task's work is worth a job's overhead,
  and grouping amortizes that overhead over the tasks of one job;
* never more blocks than keep every free slot busy, never past ``target_max_block_size``
  of input, never across input partitions when the run commits or isolates failures per
  partition;
* the first transform's ``batch_size`` is the least rows of a task (Ray Data's rule);
* the other way, a block is cut into pieces when slots would otherwise idle: with fewer
  blocks queued or on their way than free slots, the largest is sliced (in the driver, no
  data moves) into one piece per idle slot, each of at least ``batch_size`` rows, if a
  piece's work is known not to be cheap, or before anything is known, if the operator is a
  stateful class or asks for GPUs (a model). A slow model fed one block by a small input
  then runs on every copy at once (issue 28: 1,600 sentences in one block kept one of two
  model copies idle). A block on its way is one that an upstream task running and silent so
  far, or ready to start, will write (`flow.BlockFlow.blocks_to_come`): W8 #5's repartition
  emitted its two blocks a moment apart, the first was cut in two for both model copies and
  the second then ran whole after the halves (5.15 s of inference against 3.47 s). The cut
  bets that those blocks come soon: it does not weigh how long an upstream task has to run.

With ``preserve_order`` the queue is taken in input order, and a task bundles only
blocks that nothing can fall between: blocks that follow each other in one upstream
task's output, or any two once no work pending upstream could still produce a block
placed between them and no task of this operator took one.
"""

from __future__ import annotations

import bisect
import hashlib
import inspect
import math
from collections import deque

from airflow_streambatch.engine.execution.operators.base import Operator
from airflow_streambatch.engine.execution.ordering import Order
from airflow_streambatch.engine.plan.logical import MapBatches, sink_min_rows
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.tasks import TaskSpec

# A Spark job's overhead before one was measured: W2 measured 100-150 ms per job of one
# task on a 2-core machine (docs/design.md, "Task sizing").
DEFAULT_JOB_OVERHEAD_S = 0.1


def task_key(inputs: list[BlockRef]) -> str:
    """A task's stable key: the same inputs make the same task, in every attempt."""
    return hashlib.sha1(",".join(ref.block_id for ref in inputs).encode()).hexdigest()[:16]


def block_task(inputs: list[BlockRef], order: tuple[int, ...] | None = None) -> TaskSpec:
    """The task that runs over ``inputs``, descending from their input partitions; its output
    takes the place in input order of its first input, unless ``order`` says otherwise."""
    partitions = tuple(sorted({p for ref in inputs for p in ref.partitions}))
    order = order if order is not None else (inputs[0].order if inputs else ())
    return TaskSpec(task_key=task_key(inputs), partitions=partitions, inputs=tuple(inputs), order=order)


class MapOperator(Operator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Coalescing blocks of different input partitions into one task is allowed only
        # where nothing is committed or isolated per partition (set by the executor).
        self.mix_partitions = False
        first = self.physical.transforms[0] if self.physical.transforms else None
        self.min_rows = first.batch_size if isinstance(first, MapBatches) and first.batch_size else 0
        self.min_rows = max(self.min_rows, sink_min_rows(self.physical.transforms))  # write_*(min_rows_per_file=)
        self.ordered = self.ctx.execution_options.preserve_order
        # a model: presumed slow before its first task says otherwise
        self.model_like = any(inspect.isclass(getattr(t, "fn", None)) for t in self.physical.transforms) or any(
            name == "GPU" for name, _ in self.compute.resources)
        # preserve_order: the smallest place of work pending upstream, set by the flow each turn
        # (None: nothing pending; () until first set, which bundles nothing but siblings)
        self.upstream_frontier: Order | None = ()
        self._taken: list[Order] = []  # preserve_order: places of the blocks its tasks took, sorted

    def _has_new_work(self) -> bool:
        return bool(self.inputs) and (self.upstream_done or self._bundle_ready())

    def advance(self, flow) -> None:
        self._split_for_idle_slots(flow)

    def _split_for_idle_slots(self, flow) -> None:
        """Cut the largest queued block into one piece per slot that would idle, counting the blocks
        upstream tasks are about to write as taking slots (module docstring). Not with
        ``preserve_order``: pieces of one block would share its place in the order."""
        if self.ordered or self.cut or self.retry_specs or not self.inputs:
            return
        idle = self.usable_slots() - len(self.inputs)
        if idle > 0 and not self.upstream_done:
            idle -= flow.blocks_to_come(self.index)
        if idle <= 0:
            return
        largest = max(self.inputs, key=lambda ref: ref.num_rows)
        count = min(idle + 1, largest.num_rows // max(1, self.min_rows))
        if count < 2 or not (self.estimates.known or self.model_like):
            return
        if self._cheap(largest.num_rows // count, largest.size_bytes // count):
            return
        bounds = [round(i * largest.num_rows / count) for i in range(count + 1)]
        pieces = [largest.slice(lo, hi - lo) for lo, hi in zip(bounds, bounds[1:])]
        flow.split(largest, pieces)
        at = self.inputs.index(largest)
        self.inputs.remove(largest)
        for offset, piece in enumerate(pieces):
            self.inputs.insert(at + offset, piece)

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
            if bundle:
                if size + ref.size_bytes > self.ctx.target_max_block_size:
                    break  # never past the largest block a task may take
                if not self.mix_partitions and ref.partitions != bundle[0].partitions:
                    break  # another input partition where partitions must stay apart
                if self.ordered and not self._adjacent(bundle[-1], ref):
                    break  # a block still to come could fall between them
                if rows >= self.min_rows and (len(bundle) >= cap or not self._cheap(rows, size)
                                              or not self._cheap(ref.num_rows, ref.size_bytes)):
                    break
            bundle.append(ref)
            size += ref.size_bytes
            rows += ref.num_rows
        return bundle

    def _cheap(self, rows: int, size: int) -> bool:
        """Whether a task over ``rows`` rows of ``size`` bytes is worth growing: its expected
        work is under a job's overhead and its output under a block (module docstring)."""
        if not self.estimates.known or size >= self.ctx.target_min_block_size:
            return False
        work_s, output_bytes = self.estimates.for_input(rows, size)
        job_overhead_s = self.sizer.job_overhead_s or DEFAULT_JOB_OVERHEAD_S
        return work_s < job_overhead_s and output_bytes < self.ctx.target_max_block_size

    def _bundle_ready(self) -> bool:
        """A bundle may start when it is big enough (by cost, or the slot cap) and has the
        first transform's ``batch_size`` rows, or when no more input can join it."""
        bundle = self._peek_bundle()
        size = sum(r.size_bytes for r in bundle)
        rows = sum(r.num_rows for r in bundle)
        big_enough = not self._cheap(rows, size) or len(bundle) >= self._blocks_per_task_cap()
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
