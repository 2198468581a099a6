"""`Dataset`: the lazy, user-facing handle on a logical plan (Table 2 of the paper).

Transforms return a new `Dataset` with one more logical operator; consumers plan
it, run it on Spark through a `StreamingExecutor`, and read the output blocks as
they stream out. Blocks are released as soon as the consumer is done with them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator

import pyarrow as pa

from airflow_streambatch.engine.worker.batches import DEFAULT_BATCH_FORMAT, check_batch_format
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.compute import concurrency_of, task_retries, udf_threads
from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.consumption import DatasetConsumption
from airflow_streambatch.engine.dataset_combine import DatasetCombine
from airflow_streambatch.engine.dataset_methods import DatasetMethods
from airflow_streambatch.engine.dataset_repr import dataset_repr
from airflow_streambatch.engine.dataset_sort import DatasetSorting, limited_after_sort
from airflow_streambatch.engine.dataset_writes import DatasetWrites
from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.execution.executor import DONE, StreamingExecutor
from airflow_streambatch.engine.meta_count import meta_count
from airflow_streambatch.engine.transform_args import repartition_op
from airflow_streambatch.engine.split import BatchIteration, DataIterator, SplitCoordinator
from airflow_streambatch.engine.execution.partitions import warn_if_partial
from airflow_streambatch.engine.plan.planner import plan
from airflow_streambatch.engine.plan.row_errors import with_dead_letters
from airflow_streambatch.engine.worker.row_errors import check_policy
from airflow_streambatch.engine.execution.stats import RunStats
from airflow_streambatch.engine.schema import Schema  # noqa: F401 - Ray's ray.data.dataset.Schema
from airflow_streambatch.engine.plan.logical import (
    InputBlocks, Limit, MapBatches, MapRows, ResourceRequest, describe,
)


class Dataset(DatasetConsumption, BatchIteration, DatasetMethods, DatasetSorting, DatasetWrites, DatasetCombine):
    """A lazy pipeline of blocks. Build it with ``read_*``/``from_items``/``range``."""

    def __init__(self, logical: list, context: DataContext | None = None):
        self._logical = logical
        self._context = context
        self._last_stats: RunStats | None = None
        self._last_executor: StreamingExecutor | None = None

    def __repr__(self) -> str:
        return dataset_repr(self)  # Ray's form, from what is known without running (`dataset_repr.py`)

    __str__ = __repr__

    def _with(self, op) -> Dataset:
        return Dataset([*self._logical, op], self._context)

    @property
    def context(self) -> DataContext:
        return self._context or DataContext.get_current()

    # -- transforms ---------------------------------------------------------------
    def map_batches(self, fn, *, batch_size: int | None = None, batch_format: str | None = DEFAULT_BATCH_FORMAT,
                    num_cpus: float | None = None, num_gpus: float | None = None,
                    resources: dict[str, float] | None = None, concurrency: int | tuple | None = None,
                    fn_args: tuple = (), fn_kwargs: dict | None = None,
                    fn_constructor_args: tuple = (), fn_constructor_kwargs: dict | None = None,
                    on_error: str | None = None, compute=None, zero_copy_batch: bool = False,
                    max_concurrency: int | None = None, max_task_retries: int | None = None,
                    max_retries: int | None = None, max_restarts: int | None = None) -> Dataset:
        """Apply ``fn`` to batches. A class as ``fn`` is built once per worker process and reused.

        ``batch_size=None`` gives ``fn`` each input block whole. ``batch_format`` is Ray Data's:
        by default a dict of column name to NumPy array; ``"pyarrow"`` (or ``None``) hands ``fn``
        the `pyarrow.Table` the engine holds, without a conversion. GPU operators default
        to ``num_cpus=0`` so they hold only a GPU slot. ``on_error="quarantine"`` sets aside the rows
        ``fn`` raises on (found by halving the failing batch) beside the write's output, instead of
        failing the partition (``"fail"``); the default is ``DataContext.on_row_error``. Ray's ``compute=``
        (``ActorPoolStrategy``/``TaskPoolStrategy``), ``zero_copy_batch`` (False: writable NumPy arrays)
        and ``max_concurrency`` (a class's calls run at once per task) as `engine/compute.py` maps them;
        Ray's ``max_task_retries``/``max_retries``/``max_restarts``: this operator's retries of a failed
        task instead of ``DataContext.max_task_retries`` (`compute.task_retries`).
        """
        name = f"MapBatches({describe(fn)})"
        check_batch_format(batch_format, name)
        check_policy(on_error, name)
        concurrency = concurrency_of(name, fn, compute, concurrency)
        if not isinstance(zero_copy_batch, bool):
            raise TypeError(f"{name}: zero_copy_batch must be True or False, got {zero_copy_batch!r}")
        return self._with(MapBatches(
            name=name, compute=ResourceRequest.make(name, num_cpus, num_gpus, resources, concurrency, fn), fn=fn,
            batch_size=batch_size, batch_format=batch_format, fn_args=tuple(fn_args or ()), fn_kwargs=fn_kwargs or {},
            fn_constructor_args=tuple(fn_constructor_args or ()), fn_constructor_kwargs=fn_constructor_kwargs or {},
            on_error=on_error, zero_copy_batch=zero_copy_batch, threads=udf_threads(name, fn, max_concurrency, compute),
            max_task_retries=task_retries(name, fn, max_task_retries, max_retries, max_restarts),
        ))

    def _rows(self, kind: str, label: str, fn, num_cpus=None, num_gpus=None, resources=None, concurrency=None,
              fn_args=(), fn_kwargs=None, fn_constructor_args=(), fn_constructor_kwargs=None,
              on_error=None, compute=None, max_concurrency=None, max_task_retries=None, max_retries=None,
              max_restarts=None) -> Dataset:
        name = f"{label}({describe(fn)})"
        concurrency = concurrency_of(name, fn, compute, concurrency)
        udf_threads(name, fn, max_concurrency, compute)  # checked as Ray checks it; row calls run one at a time
        request = ResourceRequest.make(name, num_cpus, num_gpus, resources, concurrency, fn)
        check_policy(on_error, name)
        return self._with(MapRows(name=name, compute=request, fn=fn, kind=kind, fn_args=tuple(fn_args or ()),
                                  fn_kwargs=fn_kwargs or {}, fn_constructor_args=tuple(fn_constructor_args or ()),
                                  fn_constructor_kwargs=fn_constructor_kwargs or {}, on_error=on_error,
                                  max_task_retries=task_retries(name, fn, max_task_retries, max_retries, max_restarts)))

    def map(self, fn, **options) -> Dataset:
        """Apply ``fn`` to each row (a dict) and keep the row it returns. Takes ``map_batches``'s
        ``num_cpus``, ``num_gpus``, ``resources``, ``concurrency``, ``fn_args``, ``fn_kwargs`` and, for a
        class built once per worker, ``fn_constructor_args``/``fn_constructor_kwargs``, and ``on_error``
        (``"quarantine"``: a row ``fn`` raises on is set aside beside the write's output)."""
        return self._rows("map", "Map", fn, **options)

    def flat_map(self, fn, **options) -> Dataset:
        """Apply ``fn`` to each row and keep every row of the list it returns (options as for `map`)."""
        return self._rows("flat_map", "FlatMap", fn, **options)

    def filter(self, fn, **options) -> Dataset:
        """Keep the rows for which ``fn(row)`` is true (options as for `map`)."""
        return self._rows("filter", "Filter", fn, **options)

    def limit(self, n: int) -> Dataset:
        """The first ``n`` rows to arrive; upstream work stops once they have."""
        check_positive_int(n, "limit(n): n", allow_zero=True)
        return self._with(Limit(n))

    def repartition(self, num_blocks: int | None = None, target_num_rows_per_block: int | None = None, *,
                    strict: bool = False, shuffle: bool = False, keys=None, sort: bool = False) -> Dataset:
        """Exactly ``num_blocks`` blocks of near-equal row counts, or (``target_num_rows_per_block``)
        blocks of that many rows, the last holding the rest; waits for all input. ``shuffle=True``:
        each output block takes a slice of every input block. Ray's checks (`transform_args.py`)."""
        return self._with(repartition_op(num_blocks, target_num_rows_per_block, strict=strict, shuffle=shuffle,
                                         keys=keys, sort=sort))

    # -- execution ----------------------------------------------------------------
    def _start(self, on_commit=None, write_mode: str | None = "append", target=None,
               ordered: bool = False) -> StreamingExecutor:
        ctx = self.context
        if (ordered or limited_after_sort(self._logical)) and not ctx.execution_options.preserve_order:
            ctx = ctx.copy(execution_options={"preserve_order": True})
        logical = with_dead_letters(list(self._logical), ctx.on_row_error)
        executor = StreamingExecutor(plan(logical, ctx.enable_operator_fusion), ctx, write_mode, target)
        executor.partitions.on_commit = on_commit
        return executor.start()

    def _iter_refs(self, delete: bool = True, on_commit=None, write_mode: str | None = "append",
                   target=None, ordered: bool = False) -> Iterator[tuple[StreamingExecutor, BlockRef]]:
        """Run the plan and yield output block references as they are produced.

        The caller reads each block before asking for the next; it is released then.
        A run that finishes with failed input partitions (``max_failed_partitions``)
        warns with `PartialResultWarning`: its result lacks their rows. ``ordered``: in input
        order, as with ``preserve_order`` (`consumption.py`).
        """
        executor = self._start(on_commit, write_mode, target, ordered)
        finished = False
        try:
            while True:
                item = executor.outputs.get()
                if item is DONE:
                    finished = True
                    warn_if_partial(executor.stats.failed_partitions)
                    return
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield executor, item
                executor.release(item, delete=delete)
        finally:
            if not finished:
                executor.shutdown()
            executor.join()
            self._last_stats = executor.stats
            self._last_executor = executor
            if delete:
                executor.cleanup()

    def iter_internal_ref_bundles(self) -> Iterator[BlockRef]:
        for _, ref in self._iter_refs():
            yield ref

    def _iter_tables(self, ordered: bool = False) -> Iterator[pa.Table]:
        for executor, ref in self._iter_refs(ordered=ordered):
            table = executor.read_output(ref)
            if self._known_schema is None and table.num_columns:
                self._known_schema = table.schema  # schema(fetch_if_missing=False) knows it now
            yield table

    def iter_split(self, n: int, *, equal: bool = False) -> list[DataIterator]:
        """``n`` iterators sharing one execution per epoch (Ray Data's ``streaming_split``): blocks go to
        the consumer with the fewest rows; ``equal=True`` gives each exactly as many rows, dropping
        fewer than ``n`` at the end. Iterate each from its own thread; iterate again for another epoch."""
        check_positive_int(n, "iter_split(n): n")
        coordinator = SplitCoordinator(self, n, equal)
        return [DataIterator(coordinator, i) for i in range(n)]

    def count(self) -> int:
        """Rows in the dataset. Without a run where metadata knows them (a bare ``read_parquet``'s
        footers, ``range``, ``from_items``, a materialized dataset: `meta_count.py`, as Ray's
        ``_meta_count``); else the plan runs and its blocks' metadata are summed (no data is read)."""
        known = meta_count(self._logical)
        if known is not None:
            return known
        self._known_rows = sum(ref.num_rows for ref in self.iter_internal_ref_bundles())  # repr shows it, as Ray's
        return self._known_rows

    def materialize(self) -> MaterializedDataset:
        """Run the plan and keep its output blocks; the result reads them without recomputing."""
        refs = sorted((ref for _, ref in self._iter_refs(delete=False)), key=lambda ref: ref.order)  # input order
        executor = self._last_executor
        first = self._logical[0]
        source, read_from = (first.source, first.owner) if isinstance(first, InputBlocks) else (first, None)
        # the whole run's lineage: a lost block may need its ancestors rebuilt too
        return MaterializedDataset(refs, executor.cleanup, executor.lineage.records, self._last_stats, self._context,
                                   source, read_from)

    def stats(self) -> str:
        """Per-operator statistics of the last execution of this dataset; before one, the plan's
        operators (as Ray names them in its stats) and that none has run yet."""
        if self._last_stats is None:
            text = "This dataset has not been executed yet; stats() reports its last execution."
            try:
                ops = [op.name for op in plan(list(self._logical), self.context.enable_operator_fusion)]
            except (ValueError, TypeError):  # a plan that cannot run says so when run; stats() never raises
                return text
            return f"{text} Operators of its plan: {' -> '.join(ops)}."
        return self._last_stats.summary()

    @property
    def last_run_stats(self) -> RunStats | None:
        return self._last_stats


class _BlockOwner:
    """Deletes a materialized dataset's block files (``cleanup``, on every host that holds some)
    once neither the dataset nor any dataset built on it is referenced."""

    def __init__(self, cleanup: Callable[[], None] | None, read_from: object = None):
        # the blocks its run read: a block passed on or sliced without a task (``limit``) is their file
        self.read_from = read_from
        if cleanup is not None:
            weakref.finalize(self, cleanup)


class MaterializedDataset(Dataset):
    """A dataset whose blocks exist; its files are deleted when neither it nor a dataset built
    on it (``materialize().limit(7)``) can read them any more."""

    _in_driver_blocks: int | None = None  # blocks held in the driver's memory (`in_driver`), not in files

    def __init__(self, refs: list[BlockRef], cleanup: Callable[[], None] | None, lineage: dict,
                 stats: RunStats | None, context=None, source=None, read_from: object = None):
        super().__init__([InputBlocks(tuple(refs), lineage, _BlockOwner(cleanup, read_from), source)], context)
        self._refs = refs
        self._last_stats = stats

    @classmethod
    def in_driver(cls, read, num_blocks: int) -> MaterializedDataset:
        """Blocks that exist in the driver's memory (``from_pandas``, ``from_arrow``, ``from_numpy``:
        Ray's ``from_*`` return a `MaterializedDataset`, their blocks put in its object store at once).
        ``read`` is the source whose read tasks carry each block to the executors; no run happens
        until the data is consumed, and ``materialize()`` writes the blocks to block files."""
        dataset = cls.__new__(cls)
        Dataset.__init__(dataset, [read])
        dataset._refs = None
        dataset._in_driver_blocks = num_blocks
        return dataset

    def materialize(self) -> MaterializedDataset:
        """Itself: its blocks exist already (as in Ray Data); blocks in the driver's memory are
        written to block files first, so what is built on them reads files as after any run."""
        return self if self._refs is not None else Dataset.materialize(self)

    def num_blocks(self) -> int:
        return len(self._refs) if self._refs is not None else self._in_driver_blocks
