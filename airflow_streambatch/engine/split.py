"""``Dataset.iter_split(n)``: Ray Data's ``streaming_split``, ``n`` consumers sharing one execution.

Blocks are dealt by the coordinator, not grabbed: each output block goes to the
consumer that has received the fewest rows so far, so a fast consumer cannot take
nearly every block (each consumer reads its own queue, from its own thread, as a
training worker would). With ``equal=True`` rows are dealt in equal slices and the
last fewer-than-``n`` rows are dropped, so every consumer gets exactly the same
number of rows, as Ray documents.

Each pass over the iterators is an epoch: iterating a consumer again starts the next
execution once every consumer has finished the current one (a training loop's epochs).
Every wait is bounded by ``DataContext.stall_timeout_s`` and says which consumers it
waits for.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from airflow_streambatch.engine.iteration import batches, check_iteration_args
from airflow_streambatch.engine.worker.batches import DEFAULT_BATCH_FORMAT, check_batch_format, to_format
from airflow_streambatch.engine.worker.tensors import table_rows

_END = object()


class SplitCoordinator:
    """Runs the dataset once per epoch and deals its output to ``n`` consumer queues."""

    def __init__(self, dataset, n: int, equal: bool):
        self._dataset, self._n, self._equal = dataset, n, equal
        self._cond = threading.Condition()
        self._epoch = 0  # the execution running or last run (0: none yet)
        self._started_by: set[int] = set()  # consumers that began the current epoch
        self._finished: set[int] = set(range(n))  # consumers done with the current epoch
        self._queues: list[deque] = [deque() for _ in range(n)]
        self._source: Iterator[pa.Table] | None = None
        self._rows = [0] * n
        self._held: list[pa.Table] = []  # equal=True: rows not dealt yet

    @property
    def timeout_s(self) -> float:
        return self._dataset.context.stall_timeout_s

    def begin(self, index: int) -> None:
        """Consumer ``index`` starts a pass: it joins the current epoch if it has not read it yet,
        else it starts the next one once every consumer has finished the current one."""
        with self._cond:
            if self._epoch and index not in self._started_by:
                self._started_by.add(index)
                return
            mine = self._epoch
            self._wait(lambda: self._epoch > mine or len(self._finished) == self._n,
                       lambda: f"iter_split: consumer {index} waits to start epoch {mine + 1} until consumers "
                               f"{sorted(set(range(self._n)) - self._finished)} finish epoch {mine}")
            if self._epoch == mine:  # nobody started the next epoch yet: this consumer does
                self._epoch += 1
                self._started_by, self._finished = set(), set()
                self._queues = [deque() for _ in range(self._n)]
                self._rows, self._held = [0] * self._n, []
                self._source = self._dataset._iter_tables()
            self._started_by.add(index)

    def next_table(self, index: int) -> pa.Table | None:
        """The next table dealt to consumer ``index``; None at the end of the epoch."""
        while True:
            with self._cond:
                if self._queues[index]:
                    item = self._queues[index].popleft()
                    if item is _END:
                        self._finished.add(index)
                        self._cond.notify_all()
                        return None
                    return item
                if self._source is None:  # another consumer is pulling: wait for it to deal
                    self._wait(lambda: bool(self._queues[index]) or self._source is not None,
                               lambda: f"iter_split: consumer {index} got no block")
                    continue
                source, self._source = self._source, None  # this thread pulls; the others wait
            try:
                table = next(source, None)
            except BaseException:
                with self._cond:
                    self._deal_end()
                    self._source = None
                    self._cond.notify_all()
                raise
            with self._cond:
                if table is None:
                    self._deal_end()
                else:
                    self._deal(table)
                    self._source = source
                self._cond.notify_all()

    def _deal(self, table: pa.Table) -> None:
        if not self._equal:
            target = min(range(self._n), key=lambda i: self._rows[i])
            self._queues[target].append(table)
            self._rows[target] += table.num_rows
            return
        self._held.append(table)
        held = sum(t.num_rows for t in self._held)
        if held >= self._n:
            self._deal_equal(held - held % self._n)

    def _deal_equal(self, rows: int) -> None:
        """Deal the first ``rows`` held rows (a multiple of n) in n equal slices; keep the rest."""
        merged = pa.concat_tables(self._held, promote_options="default")
        share = rows // self._n
        for i in range(self._n):
            if share:
                self._queues[i].append(merged.slice(i * share, share))
                self._rows[i] += share
        rest = merged.slice(rows)
        self._held = [rest] if rest.num_rows else []

    def _deal_end(self) -> None:
        self._held = []  # equal=True: fewer than n rows left, dropped as Ray Data drops them
        for queue in self._queues:
            queue.append(_END)

    def _wait(self, ready, why) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not ready():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{why()} after {self.timeout_s:.0f} s (DataContext.stall_timeout_s); "
                                   "iterate every iterator of iter_split, each from its own thread")
            self._cond.wait(left)


class BatchIteration:
    """``iter_batches`` and ``iter_rows`` over whatever ``_iter_tables`` yields (a `Dataset`, a `DataIterator`)."""

    def _iter_tables(self) -> Iterator[pa.Table]:
        raise NotImplementedError

    def _tables_to_iterate(self, seeded: bool) -> Iterator[pa.Table]:
        """The tables ``iter_*`` reads; a `Dataset` keeps input order where it can (`consumption.py`)."""
        return self._iter_tables()

    def iter_batches(self, *, prefetch_batches: int = 1, batch_size: int | None = 256,
                     batch_format: str | None = DEFAULT_BATCH_FORMAT, drop_last: bool = False,
                     local_shuffle_buffer_size: int | None = None, local_shuffle_seed: int | None = None,
                     prefetch_blocks: int = 0) -> Iterator:
        """Batches of ``batch_size`` rows (``None``: one per block) in ``batch_format`` (as in Ray Data:
        ``"default"``/``"numpy"`` a dict of NumPy arrays, ``"pandas"``, ``"pyarrow"``; ``None`` the
        blocks' own `pyarrow.Table`). ``drop_last``, ``local_shuffle_buffer_size`` and
        ``local_shuffle_seed`` as in Ray Data (`iteration.py`); the prefetch arguments are checked,
        and the executor already runs ahead of the consumer."""
        check_batch_format(batch_format, "iter_batches")
        if isinstance(batch_size, np.integer):  # a NumPy integer (``np.random.randint``'s), as Ray takes it
            batch_size = int(batch_size)
        check_iteration_args("iter_batches", batch_size=batch_size, drop_last=drop_last,
                             local_shuffle_buffer_size=local_shuffle_buffer_size,
                             local_shuffle_seed=local_shuffle_seed, prefetch_batches=prefetch_batches,
                             prefetch_blocks=prefetch_blocks)
        tables = self._tables_to_iterate(local_shuffle_buffer_size is not None and local_shuffle_seed is not None)
        for batch in batches(tables, batch_size, drop_last=drop_last,
                             local_shuffle_buffer_size=local_shuffle_buffer_size,
                             local_shuffle_seed=local_shuffle_seed):
            yield to_format(batch, batch_format)

    def iter_rows(self, *, prefetch_batches: int = 1, prefetch_blocks: int = 0) -> Iterator[dict]:
        """Each row as a dict; the prefetch arguments as for ``iter_batches``."""
        check_iteration_args("iter_rows", batch_size=None, prefetch_batches=prefetch_batches,
                             prefetch_blocks=prefetch_blocks)
        for table in self._tables_to_iterate(False):
            yield from table_rows(table)


class DataIterator(BatchIteration):
    """One consumer of ``Dataset.iter_split``: iterate it from its own thread, once per epoch."""

    def __init__(self, coordinator: SplitCoordinator, index: int):
        self._coordinator = coordinator
        self.index = index

    def _iter_tables(self) -> Iterator[pa.Table]:
        self._coordinator.begin(self.index)
        while (table := self._coordinator.next_table(self.index)) is not None:
            yield table
