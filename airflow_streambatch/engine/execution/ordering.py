"""``preserve_order``: blocks reach the consumer, and each ``limit``, in input order.

Every block carries its place in input order (`BlockRef.order`: its read task's
partition, then its index in each task's output down the chain). With the option on,
blocks bound for the consumer or for a limit wait in an `OrderGate` and pass only once
nothing earlier can still come: once their place is before the smallest place of all
work still pending upstream (queued blocks, queued and running tasks, reads not yet
launched, blocks held by an earlier gate). Output is then the same, in the same order,
on every run, and ``limit(n)`` keeps the first ``n`` rows of the input.

The price is latency, not work: a block waits for every block before it, and a task's
streamed blocks wait for the task to end (`benchmarks/order_cost.py`). Held blocks count against ``memory_limit``
like any other. A repartition restarts the places (its output block ``j`` is
``(j,)``), so a gate after it looks only at the work from the repartition on.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable

from airflow_streambatch.engine.protocol.blocks import BlockRef

Order = tuple[int, ...]


def min_order(*groups: Iterable[Order]) -> Order | None:
    """The smallest place among ``groups`` (None when all are empty or None)."""
    places = [place for group in groups if group is not None for place in group if place is not None]
    return min(places) if places else None


class OrderGate:
    """Holds the blocks bound for one position (the consumer, or a limit) until their turn."""

    def __init__(self, index: int):
        self.index = index
        self._heap: list[tuple[Order, int, BlockRef]] = []
        self._ties = itertools.count()  # slices of one block share its place: keep their arrival order

    def add(self, ref: BlockRef) -> None:
        heapq.heappush(self._heap, (ref.order, next(self._ties), ref))

    def held(self) -> Order | None:
        return self._heap[0][0] if self._heap else None

    def release(self, frontier: Order | None, deliver: Callable[[int, BlockRef], None]) -> None:
        """Pass on every block placed before ``frontier`` (all of them when nothing is pending)."""
        while self._heap and (frontier is None or self._heap[0][0] < frontier):
            deliver(self.index, heapq.heappop(self._heap)[2])

    def drop(self, partition: int) -> list[BlockRef]:
        """A failed partition's held blocks, removed (for the caller to release)."""
        dropped = [ref for _, _, ref in self._heap if partition in ref.partitions]
        self._heap = [item for item in self._heap if partition not in item[2].partitions]
        heapq.heapify(self._heap)
        return dropped
