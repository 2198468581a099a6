"""Ray Data's first consumers on `Dataset`: ``take``, ``take_all``, ``schema``, ``input_files``,
``len()`` and the deprecated ``fully_executed``, with Ray's arguments and errors.

Order. Ray Data leaves ``preserve_order`` off by default, yet its consumers return the rows
of a small dataset in input order, and Ray Data programs (and its own tests) rely on it:
``from_items(rows).take_all() == rows``, ``range(100).limit(5).take() == first five``. Here,
without ``DataContext.execution_options.preserve_order``:

* ``take_all``, ``to_pandas``, ``to_arrow`` run as before (blocks stream in and are released
  as they come, so memory and speed are unchanged) and the driver then sorts the blocks by
  their place in input order (`BlockRef.order`): exact for blocks of read tasks and of maps
  fused into them; a separate map operator whose tasks bundled small blocks of different
  read tasks out of order keeps that order (set ``preserve_order`` for a guarantee);
* ``take(n)``, ``take_batch(n)``, ``show(n)`` and ``iter_rows``/``iter_batches`` run with
  order preserved (`execution/ordering.py`) when the source is in the driver's memory or a
  ``range`` (``from_items``, ``from_pandas``, ``from_arrow``, ``from_numpy``, ``from_blocks``)
  or a materialized dataset, and ``iter_batches`` also whenever a ``local_shuffle_seed`` is
  given (a seeded shuffle repeats only over the same input order). Over files they take
  blocks as they come, so ``read_parquet(big_file).take(5)`` does not wait for the whole
  file's read task and a large read feeding a training loop never waits for a slow early
  task; ``take(n)``'s rows are then sorted by place among those taken.
"""

from __future__ import annotations

import urllib.parse
import warnings
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

from airflow_streambatch.engine.errors import DatasetLengthError, check_positive_int
from airflow_streambatch.engine.path_args import previewing_file_order
from airflow_streambatch.engine.plan.logical import InputBlocks, Read
from airflow_streambatch.engine.plan.sort import SortBy
from airflow_streambatch.engine.schema import Schema
from airflow_streambatch.engine.split import BatchIteration
from airflow_streambatch.engine.worker.tensors import table_rows

# sources whose rows the driver already holds or generates: iterated in input order
IN_MEMORY_SOURCES = frozenset({"FromItems", "Range", "RangeTensor", "FromArrow", "FromPandas", "FromNumpy",
                               "FromBlocks"})


class DatasetConsumption:
    """Mixed into `Dataset`; relies on its ``_logical``, ``context``, ``limit``, ``materialize``,
    ``_iter_refs`` and ``_iter_tables(ordered=)``."""

    _known_schema: pa.Schema | None = None  # from the last run that read a block of this dataset
    _known_rows: int | None = None  # from the last count() that ran this dataset's plan

    def __len__(self) -> int:
        raise DatasetLengthError("len() of a Dataset is not defined (as in Ray): call ds.count(), which counts its "
                                 "rows from metadata where it can and otherwise runs the pipeline")

    def __bool__(self) -> bool:
        return True  # a Dataset is a plan, never empty as an object (len() is not defined)

    def _keeps_input_order(self) -> bool:
        """In input order: in-memory sources; and a sort's or groupby's output, whose order is the point."""
        source = self._logical[0]
        return isinstance(source, InputBlocks) or any(isinstance(op, SortBy) for op in self._logical) or (
            isinstance(source, Read) and source.datasource.name in IN_MEMORY_SOURCES)

    def _tables_to_iterate(self, seeded: bool) -> Iterator[pa.Table]:
        return self._iter_tables(ordered=seeded or self._keeps_input_order())

    def _gathered(self, gate: bool, most: int | None = None) -> list[pa.Table]:
        """Every output table, sorted into input order by block place (`BlockRef.order`, stable for
        slices of one block); ``gate``: run with order preserved, so it is exact. ``most``: a
        ``take_all(limit)``, refused (the run stopped) as soon as more rows than that arrive."""
        placed, rows = [], 0
        refs = self._iter_refs(ordered=gate)
        try:
            for executor, ref in refs:
                rows += ref.num_rows
                if most is not None and rows > most:
                    raise ValueError(f"take_all(limit={most}): the dataset has more than the given limit of {most} "
                                     "rows; raise limit, or take(n) the first rows")
                placed.append((ref.order, len(placed), executor.read_output(ref)))
        finally:
            refs.close()  # a refused limit stops the run now, not when the traceback is dropped
        if self._known_schema is None:
            self._known_schema = next((t.schema for _, _, t in placed if t.num_columns), None)
        return [table for _, _, table in sorted(placed, key=lambda item: item[:2])]

    def take(self, limit: int = 20) -> list[dict]:
        """The first ``limit`` rows (see the module's note on order); fewer if there are fewer."""
        check_positive_int(limit, "take(limit): limit", allow_zero=True)
        head = self.limit(limit)
        return [row for table in head._gathered(head._keeps_input_order()) for row in table_rows(table)]

    def take_all(self, limit: int | None = None) -> list[dict]:
        """Every row, in input order; ``ValueError`` as soon as there are more than ``limit``."""
        check_positive_int(limit, "take_all(limit): limit", allow_zero=True, allow_none=True)
        return [row for table in self._gathered(False, limit) for row in table_rows(table)]

    def schema(self, fetch_if_missing: bool = True) -> Schema | None:
        """The columns and types (Ray's `Schema`) of the first output block; runs the pipeline until
        one exists unless a run of this dataset already read a block. ``fetch_if_missing=False``:
        only what is known, else None. None for a dataset without blocks."""
        if self._known_schema is None and fetch_if_missing:
            refs = self.limit(1)._iter_refs()
            try:
                for executor, ref in refs:
                    self._known_schema = executor.read_output(ref).schema
                    break
            finally:
                refs.close()  # stops the run now, not when the generator is collected
        return None if self._known_schema is None else Schema(self._known_schema)

    def input_files(self) -> list[str]:
        """The files a file read lists (after ``file_extensions``, ``partition_filter`` and
        ``ignore_missing_paths``), each once, without a URI scheme as Ray gives them
        (``s3://bucket/key`` is ``bucket/key``); ``[]`` for data from memory. Lists the files, reads none."""
        source = self._logical[0]
        if isinstance(source, InputBlocks):
            source = source.source
        if not isinstance(source, Read):
            return []
        with previewing_file_order():  # not an execution: a shuffled read's next run keeps its order
            tasks = source.datasource.plan(1, source.override_num_blocks, self.context.target_max_block_size)
        return list(dict.fromkeys(_without_scheme(path) for task in tasks for path in task.files))

    def iterator(self) -> DatasetIterator:
        """Ray's ``ds.iterator()``: the whole dataset as a `DataIterator` (``iter_batches``,
        ``iter_rows``, ``iter_torch_batches``, with the same arguments); every pass runs it again."""
        return DatasetIterator(self)

    def fully_executed(self):
        """Ray Data's name before 2.5 for ``materialize()`` (deprecated there, as here)."""
        warnings.warn("Dataset.fully_executed() is deprecated (Ray Data renamed it): call materialize()",
                      DeprecationWarning, stacklevel=2)
        return self.materialize()

    def is_fully_executed(self) -> bool:
        """Whether this dataset's blocks exist (deprecated in Ray Data: check
        ``isinstance(ds, MaterializedDataset)``)."""
        warnings.warn("Dataset.is_fully_executed() is deprecated (as in Ray Data): check "
                      "isinstance(ds, MaterializedDataset)", DeprecationWarning, stacklevel=2)
        in_driver = getattr(self, "_in_driver_blocks", None) is not None  # from_pandas & co (`MaterializedDataset`)
        return in_driver or (len(self._logical) == 1 and isinstance(self._logical[0], InputBlocks))


class DatasetIterator(BatchIteration):
    """What ``Dataset.iterator()`` returns. As Ray's, what its ``iter_*`` return can be iterated again
    (each pass a new run), so a training loop may keep it across epochs."""

    def __init__(self, dataset):
        self._dataset = dataset

    def _iter_tables(self) -> Iterator[pa.Table]:
        return self._dataset._iter_tables()

    def _tables_to_iterate(self, seeded: bool) -> Iterator[pa.Table]:
        return self._dataset._tables_to_iterate(seeded)

    def iter_batches(self, **args) -> Iterable:
        return _Passes(lambda: BatchIteration.iter_batches(self, **args))

    def iter_rows(self, **args) -> Iterable:
        return _Passes(lambda: BatchIteration.iter_rows(self, **args))

    def iter_torch_batches(self, **args) -> Iterable:
        return _Passes(lambda: self._dataset.iter_torch_batches(**args))

    def stats(self) -> str:
        return self._dataset.stats()


class _Passes:
    """An iterable whose every ``iter()`` is a new pass (a new run) of ``start()``'s generator."""

    def __init__(self, start: Callable[[], Iterator]):
        self._start = start

    def __iter__(self) -> Iterator:
        return self._start()


def _without_scheme(path: str) -> str:
    """``s3://bucket/key`` as ``bucket/key`` (credentials before ``@`` dropped); a plain path unchanged."""
    if "://" not in path:
        return path
    parsed = urllib.parse.urlparse(path, allow_fragments=False)
    return parsed.netloc.rsplit("@", 1)[-1] + parsed.path
