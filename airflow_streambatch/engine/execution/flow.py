"""Block flow: how a block moves from the operator that produced it to the next one.

A produced block is accounted in the ledger (it counts against memory), then handed
to the next operator (`Operator.accept`) or, after the last, to the consumer's
queue. A block of a failed partition, or produced upstream of a satisfied limit, is
released at once. The driver holds `BlockRef`s only; a block's file is deleted once
the task that consumed it has finished. With ``preserve_order``, blocks bound for the
consumer or a limit pass through an `OrderGate` first (`ordering.py`).
"""

from __future__ import annotations

import queue
from collections.abc import Callable

from airflow_streambatch.engine.execution.memory import BlockLedger
from airflow_streambatch.engine.execution.operators import LimitOperator, MapOperator, Operator, RepartitionOperator
from airflow_streambatch.engine.execution.ordering import Order, OrderGate, min_order
from airflow_streambatch.engine.execution.partitions import PartitionTracker
from airflow_streambatch.engine.protocol.blocks import BlockRef


class BlockFlow:
    def __init__(self, operators: list[Operator], ledger: BlockLedger, partitions: PartitionTracker,
                 outputs: queue.Queue, running_orders: Callable[[int], list[Order]] = lambda index: [],
                 silent_tasks: Callable[[int], int] = lambda index: 0):
        """``running_orders``: the input-order places of an operator's running tasks (`Launcher.running_orders`);
        ``silent_tasks``: how many of its running tasks have written nothing yet (`Launcher.silent_tasks`)."""
        self.operators = operators
        self.ledger = ledger
        self.partitions = partitions
        self.outputs = outputs
        self.gates: dict[int, OrderGate] = {}
        if operators and operators[0].ctx.execution_options.preserve_order:
            ends = [op.index for op in operators if isinstance(op, LimitOperator)] + [len(operators)]
            self.gates = {index: OrderGate(index) for index in ends}
        self.running_orders = running_orders
        self.silent_tasks = silent_tasks

    def holds(self, path: str) -> bool:
        """Whether a block of the run still uses the file at ``path`` (a replay writes it again)."""
        return self.ledger.holds(path)

    def emit(self, op: Operator, ref: BlockRef, owned: bool = True) -> None:
        """A block produced by ``op`` (``owned=False``: it belongs to someone else, never deleted)."""
        if owned:
            self.ledger.add(op, ref)
        if op.cut or self.partitions.is_failed(ref.partitions):
            self.release(ref)
        else:
            self.deliver(op.index + 1, ref)

    def deliver(self, index: int, ref: BlockRef) -> None:
        gate = self.gates.get(index)
        if gate is not None:
            gate.add(ref)
        else:
            self._deliver_now(index, ref)

    def _deliver_now(self, index: int, ref: BlockRef) -> None:
        if index == len(self.operators):
            self.outputs.put(ref)
        else:
            self.operators[index].accept(ref, self)

    def queue(self, op: Operator, ref: BlockRef) -> None:
        self.partitions.hold(ref)
        op.inputs.append(ref)

    def release(self, ref: BlockRef, delete: bool = True) -> None:
        self.partitions.drop(ref)
        self.ledger.release(ref, delete)

    def split(self, whole: BlockRef, parts: list[BlockRef]) -> None:
        """``whole`` (queued or just produced) is replaced by slices of it."""
        self.ledger.split(whole, parts)
        self.partitions.split(whole, parts)

    def cut_upstream(self, limit_index: int) -> None:
        """A limit is reached: nothing upstream of it needs to run any more."""
        for op in self.operators[:limit_index]:
            op.cut = True
            op.clear_pending(self)
        self.operators[limit_index].upstream_done = True

    def drop_partition(self, partition: int) -> None:
        """A failed partition: its queued blocks and pending work are dropped, never committed."""
        for op in self.operators:
            for ref in op.drop_partition(partition):
                self.release(ref)
        for gate in self.gates.values():
            for ref in gate.drop(partition):
                self.release(ref)

    def release_in_order(self) -> None:
        """Pass on the gated blocks whose turn has come, nearest the source first (a limit's
        blocks may then reach the consumer's gate in the same call); tell each map operator
        what is still pending upstream of it, so that it may bundle blocks nothing can fall between."""
        if not self.gates:  # preserve_order is off
            return
        for index in sorted(self.gates):
            self.gates[index].release(self._frontier(index), self._deliver_now)
        for op in self.operators:
            if isinstance(op, MapOperator):
                op.upstream_frontier = self._frontier(op.index)

    def _frontier(self, index: int) -> Order | None:
        """The smallest place of any work still pending upstream of position ``index`` (from the
        last repartition on: it restarts the places)."""
        start = max((op.index for op in self.operators[:index] if isinstance(op, RepartitionOperator)), default=0)
        pending = [op.min_pending_order() for op in self.operators[start:index]]
        running = [place for op in self.operators[start:index] for place in self.running_orders(op.index)]
        held = [gate.held() for i, gate in self.gates.items() if start < i < index]
        return min_order(pending, running, held)

    def blocks_to_come(self, index: int) -> int:
        """About how many blocks will reach operator ``index`` soon, besides those queued there: one
        for each task of the nearest upstream operator that runs tasks that is running and has
        written nothing yet, or is ready to start (a barrier's cut ranges, queued blocks, retries).
        An operator that cuts blocks for idle slots counts these first: W8 #5's repartition emitted
        two blocks a moment apart, and the model cut the first for the slot the second would take."""
        count = 0
        for op in reversed(self.operators[:index]):
            count += op.ready_tasks() + self.silent_tasks(op.index)
            if op.runs_tasks:
                break
        return count

    def propagate_done(self) -> None:
        for upstream, op in zip(self.operators, self.operators[1:]):
            if upstream.done:
                op.upstream_done = True

    def advance(self) -> None:
        """Pass completion downstream and let operators act on it (repartition barriers)."""
        self.propagate_done()
        for op in self.operators:
            op.advance(self)
        self.propagate_done()
        self.release_in_order()
