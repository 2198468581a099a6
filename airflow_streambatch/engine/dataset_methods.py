"""Ray Data's column operations, global aggregates and in-driver consumers, on `Dataset`.

Each is built from the engine's own operators (a ``map_batches`` over whole blocks,
run on the executors) and consumers, so it streams, retries and recovers like any
pipeline. ``sum``/``min``/``max``/``mean``/``std`` are ``Dataset.aggregate`` with the
`aggregate` module's built-ins, as in Ray: partials per map task, merged in a reduce task.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_streambatch.engine import lineage_serialization
from airflow_streambatch.engine.aggregate import Max, Mean, Min, Std, Sum
from airflow_streambatch.engine.worker.batches import DEFAULT_BATCH_FORMAT, from_udf_output, to_format
from airflow_streambatch.engine.transform_args import check_sample

_ARROW = {"batch_size": None, "batch_format": "pyarrow"}  # whole blocks as the engine holds them


class DatasetMethods:
    """Mixed into `Dataset`; relies on its ``map_batches``, ``limit``, ``iter_batches``,
    ``iter_internal_ref_bundles``, ``schema`` and ``_iter_tables``."""

    # -- columns --------------------------------------------------------------------
    def select_columns(self, cols: str | list[str]):
        """Only ``cols``, in that order."""
        return self.map_batches(partial(_select, cols=_names(cols, "select_columns", allow_empty=True)), **_ARROW)

    def drop_columns(self, cols: str | list[str]):
        """Every column but ``cols``."""
        return self.map_batches(partial(_drop, cols=_names(cols, "drop_columns", allow_empty=True)), **_ARROW)

    def rename_columns(self, names: dict[str, str] | list[str]):
        """Rename by a ``{old: new}`` mapping, or give every column a new name in order."""
        if not isinstance(names, (dict, list)):
            raise TypeError(f"rename_columns expects a dict or a list of names, got {type(names).__name__}")
        return self.map_batches(partial(_rename, names=names), **_ARROW)

    def add_column(self, col: str, fn: Callable, *, batch_format: str | None = "pandas"):
        """Add (or replace) column ``col`` with ``fn(batch)``, a batch in ``batch_format``
        (``"pandas"`` by default, as in Ray Data)."""
        if not callable(fn):
            raise ValueError(f"add_column({col!r}): fn must be a function of a batch, got {type(fn).__name__}")
        return self.map_batches(partial(_add_column, col=col, fn=fn, batch_format=batch_format), **_ARROW)

    def random_sample(self, fraction: float, *, seed: int | None = None):
        """Each row kept with probability ``fraction``; with ``seed``, the same rows on every run.
        Ray's checks: ``ValueError`` for a fraction outside [0, 1] or a source known to be empty."""
        check_sample(self._logical, fraction)
        return self.map_batches(partial(_sample, fraction=fraction, seed=seed), **_ARROW)

    # -- aggregates -----------------------------------------------------------------
    def sum(self, on: str | list[str] | None = None, ignore_nulls: bool = True):
        return self._aggregate_on(Sum, on, ignore_nulls=ignore_nulls)

    def min(self, on: str | list[str] | None = None, ignore_nulls: bool = True):
        return self._aggregate_on(Min, on, ignore_nulls=ignore_nulls)

    def max(self, on: str | list[str] | None = None, ignore_nulls: bool = True):
        return self._aggregate_on(Max, on, ignore_nulls=ignore_nulls)

    def mean(self, on: str | list[str] | None = None, ignore_nulls: bool = True):
        return self._aggregate_on(Mean, on, ignore_nulls=ignore_nulls)

    def std(self, on: str | list[str] | None = None, ddof: int = 1, ignore_nulls: bool = True):
        return self._aggregate_on(Std, on, ddof=ddof, ignore_nulls=ignore_nulls)

    def _aggregate_on(self, kind: type, on, **options):
        """``Dataset.aggregate`` of one ``kind`` (`aggregate.Sum`, ...) per column, as Ray's ``sum`` & co.
        build theirs: ``on`` a column or a list, or None for every column of the schema (which, as in
        Ray, runs the pipeline to its first block unless the schema is known). Ray's shapes: one
        aggregate gives its value, several ``{"sum(col)": value}``; None for a dataset without rows
        (or without a schema); with ``ignore_nulls=False`` a null makes a value None."""
        if on is None:
            schema = self.schema()
            if schema is None or not schema.names:
                return None
            cols = list(schema.names)
        else:
            cols = _names(on, kind.label)
        result = self.aggregate(*(kind(col, **options) for col in cols))
        if result is not None and len(result) == 1:
            return next(iter(result.values()))
        return result

    def unique(self, column: str) -> list:
        """The distinct values of ``column`` (each block reduced on the executors first)."""
        values = self.select_columns([column]).map_batches(partial(_unique, column=column), **_ARROW)
        seen: dict = {}
        for table in values._iter_tables():
            seen.update(dict.fromkeys(table.column(column).to_pylist()))
        return list(seen)

    # -- consumers --------------------------------------------------------------------
    def take_batch(self, batch_size: int = 20, *, batch_format: str | None = DEFAULT_BATCH_FORMAT):
        """Up to ``batch_size`` rows as one batch; ValueError for a dataset without rows."""
        head = self.limit(batch_size)
        tables = head._gathered(head._keeps_input_order())  # the first rows (`consumption.py`)
        if not any(t.num_rows for t in tables):
            raise ValueError("take_batch: the dataset has no rows")
        return to_format(pa.concat_tables(tables, promote_options="default"), batch_format)

    def show(self, limit: int = 20) -> None:
        """Print up to ``limit`` rows, one per line."""
        for row in self.take(limit):
            print(row)

    def columns(self, fetch_if_missing: bool = True) -> list[str] | None:
        schema = self.schema(fetch_if_missing=fetch_if_missing)
        return None if schema is None else schema.names

    def num_blocks(self) -> int:
        """The number of output blocks (runs the pipeline; block sizes follow ``target_max_block_size``)."""
        return sum(1 for _ in self.iter_internal_ref_bundles())

    def size_bytes(self) -> int | None:
        """The in-memory (Arrow) size of the output, from block metadata (runs the pipeline); ``None``
        when the output has no blocks (an empty dataset), as Ray returns when it has no block metadata."""
        sizes = [ref.size_bytes for ref in self.iter_internal_ref_bundles()]
        return sum(sizes) if sizes else None

    def to_arrow(self) -> pa.Table:
        """Every row in the driver, as one `pyarrow.Table` (Ray's ``to_arrow_refs`` has no meaning here)."""
        tables = self._gathered(False)  # in input order (`consumption.py`)
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables, promote_options="default")

    def to_pandas(self, limit: int | None = None):
        """Every row in the driver as a DataFrame; ValueError if there are more than ``limit``."""
        table = self.to_arrow() if limit is None else pa.concat_tables(
            self.limit(limit + 1)._gathered(False) or [pa.table({})], promote_options="default")
        if limit is not None and table.num_rows > limit:
            raise ValueError(f"to_pandas(limit={limit}): the dataset has more than {limit} rows")
        return table.to_pandas()

    def iter_torch_batches(self, *, prefetch_batches: int = 1, batch_size: int | None = 256, dtypes=None,
                           device: str = "auto", collate_fn: Callable | None = None, drop_last: bool = False,
                           local_shuffle_buffer_size: int | None = None,
                           local_shuffle_seed: int | None = None) -> Iterator:
        """Batches as dicts of `torch.Tensor` (torch must be installed); ``device="auto"`` is CUDA
        when available. ``collate_fn`` takes the NumPy batch instead and returns what to yield.
        The other arguments are ``iter_batches``'s."""
        try:
            import torch
        except ImportError:
            raise ImportError("iter_torch_batches needs PyTorch: pip install torch") from None
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        for batch in self.iter_batches(batch_size=batch_size, batch_format="numpy", prefetch_batches=prefetch_batches,
                                       drop_last=drop_last, local_shuffle_buffer_size=local_shuffle_buffer_size,
                                       local_shuffle_seed=local_shuffle_seed):
            if collate_fn is not None:
                yield collate_fn(batch)
                continue
            yield {name: torch.as_tensor(np.require(values, requirements="W"),  # arrays from Arrow are read-only
                                         dtype=dtypes.get(name) if isinstance(dtypes, dict) else dtypes, device=device)
                   for name, values in batch.items()}

    # -- lineage ----------------------------------------------------------------------
    def has_serializable_lineage(self) -> bool:
        """Whether `serialize_lineage` can store this dataset: it starts from a read (Ray's rule)."""
        return lineage_serialization.unsupported_reason(self._logical) is None

    def serialize_lineage(self) -> bytes:
        """This dataset's logical plan (no data) as bytes `deserialize_lineage` rebuilds it from,
        in this or another process; ``ValueError`` for data from the driver's memory (``from_*``),
        existing blocks, zips and unions of anything but bare reads, as in Ray."""
        return lineage_serialization.serialize_lineage(self)

    @staticmethod
    def deserialize_lineage(serialized_ds: bytes):
        """The dataset whose `serialize_lineage` gave ``serialized_ds`` (a pickle: trusted bytes only)."""
        return lineage_serialization.deserialize_lineage(serialized_ds)


def _names(cols, where: str, allow_empty: bool = False) -> list[str]:
    """Column names; an empty list only where Ray takes one (``select_columns([])`` keeps the rows
    and no column, ``drop_columns([])`` drops nothing)."""
    names = [cols] if isinstance(cols, str) else list(cols) if isinstance(cols, (list, tuple)) else None
    if names is None or (not names and not allow_empty) or not all(isinstance(c, str) for c in names):
        wanted = "a list of names" if allow_empty else "a non-empty list of names"
        raise TypeError(f"{where}: give a column name or {wanted}, got {cols!r}")
    return names


def _check_present(table: pa.Table, cols: list[str], where: str) -> None:
    missing = [c for c in cols if c not in table.column_names]
    if missing:
        raise ValueError(f"{where}: no column(s) {missing}; the columns are {table.column_names}")


def _select(table: pa.Table, cols: list[str]) -> pa.Table:
    _check_present(table, cols, "select_columns")
    return table.select(cols)


def _drop(table: pa.Table, cols: list[str]) -> pa.Table:
    _check_present(table, cols, "drop_columns")
    return table.drop_columns(list(dict.fromkeys(cols)))  # a name given twice is dropped once, as in Ray


def _rename(table: pa.Table, names) -> pa.Table:
    if isinstance(names, list):
        if len(names) != table.num_columns:
            raise ValueError(f"rename_columns: {len(names)} names for {table.num_columns} columns "
                             f"{table.column_names}")
        return table.rename_columns(names)
    _check_present(table, list(names), "rename_columns")
    return table.rename_columns([names.get(c, c) for c in table.column_names])


def _add_column(table: pa.Table, col: str, fn: Callable, batch_format: str | None) -> pa.Table:
    column = fn(to_format(table, batch_format))
    if np.ndim(column) == 0:  # one value for every row, as pandas' ``batch[col] = 1`` in Ray's add_column
        column = np.full(table.num_rows, column)
    values = from_udf_output({col: np.asarray(column) if not isinstance(column, (pa.Array, pa.ChunkedArray))
                              else column}, f"add_column({col!r})").column(col)
    if col in table.column_names:
        return table.set_column(table.column_names.index(col), col, values)
    return table.append_column(col, values)


def _sample(table: pa.Table, fraction: float, seed: int | None) -> pa.Table:
    key = None if seed is None else [seed, table.num_rows, zlib.crc32(repr(table.slice(0, 1).to_pylist()).encode())]
    return table.filter(pa.array(np.random.default_rng(key).random(table.num_rows) < fraction))


def _unique(table: pa.Table, column: str) -> pa.Table:
    return pa.table({column: pc.unique(table.column(column))})
