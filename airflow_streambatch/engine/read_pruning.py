"""Read pruning: ``columns=`` and row filters (pyarrow expressions) on the reads.

Ray Data's ``read_parquet(columns=, filter=)`` hands both to pyarrow's Parquet scan, so
columns nobody asked for are never decoded and row groups whose statistics exclude the
filter are never fetched (`parquet_ranges.read_row_groups` does that here). The other
formats have no statistics to skip by: `prune_reads` applies the same ``columns`` and
filter to every table a read task parses, inside the task, so nothing pruned leaves it
(the same rows and columns as Parquet would give, without the saved I/O).

A filter is a `pyarrow.compute.Expression` (``pc.field("lang") == "en"``;
``pyarrow.dataset.field`` is the same thing) or, as Ray passes ``filter`` through
`pyarrow.parquet.filters_to_expression`, pyarrow's DNF list of tuples. It may name
columns that ``columns`` leaves out, partition columns and, with ``include_paths``, the
``path`` column. An epoch run by spark-submit carries its filter in the spec file:
`encode_filter` / `decode_filter` turn it into text and back, and the decoding accepts
only what a pickled expression needs (nothing else in that text can run code).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import pickle
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_streambatch.engine.dataset import Dataset
from airflow_streambatch.engine.plan.datasource import Datasource, ReadTask
from airflow_streambatch.engine.plan.logical import Read

FILTER_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError)


def check_columns(columns, where: str) -> list[str] | None:
    """``columns`` as a list of names (duplicates dropped, order kept), or None for every column."""
    if columns is None:
        return None
    if isinstance(columns, (str, bytes)) or not isinstance(columns, (list, tuple)) \
            or not all(isinstance(c, str) for c in columns):
        raise TypeError(f"{where}: columns must be a list of column names, e.g. ['id', 'text'], got {columns!r}")
    return list(dict.fromkeys(columns))


def check_filter(row_filter, where: str, name: str = "filter") -> pc.Expression | None:
    """A pyarrow expression, from one or from pyarrow's DNF list of tuples (as Ray accepts both)."""
    if row_filter is None or isinstance(row_filter, pc.Expression):
        return row_filter
    if isinstance(row_filter, list):
        try:
            return pq.filters_to_expression(row_filter)
        except (ValueError, TypeError, pa.ArrowException) as exc:
            raise ValueError(f"{where}: {name}={row_filter!r} is not pyarrow's DNF form "
                             f"([('lang', '=', 'en')] or [[...], [...]]): {exc}") from exc
    raise TypeError(f"{where}: {name} must be a pyarrow.compute.Expression, e.g. pyarrow.compute.field('lang') "
                    f"== 'en', got {type(row_filter).__name__}")


def bind_filter(row_filter: pc.Expression, schema: pa.Schema, where: str, what: str, name: str = "filter") -> None:
    """Fail now, naming the argument, when the filter does not fit ``schema`` (a column it names is
    missing, a comparison of mismatched types, an expression that is not a condition); checked on
    an empty table, so nothing is read."""
    try:
        schema.empty_table().filter(row_filter)
    except FILTER_ERRORS as exc:
        raise ValueError(f"{where}: {name}={row_filter} does not fit {what} (columns {schema.names}): "
                         f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc


def check_selected(columns: list[str] | None, names: list[str], where: str, what: str) -> None:
    missing = [c for c in columns or () if c not in names]
    if missing:
        raise ValueError(f"{where}: columns={columns} names {missing}, which {what} does not have "
                         f"(its columns: {names})")


def prune_table(table: pa.Table, columns: list[str] | None, row_filter: pc.Expression | None, where: str,
                what: str, name: str = "filter") -> pa.Table:
    """The table's rows that pass the filter, with ``columns`` in the order named (the filter sees
    every column, selected or not)."""
    if row_filter is not None:
        bind_filter(row_filter, table.schema, where, what, name)
        table = table.filter(row_filter)
    if columns is not None:
        check_selected(columns, table.column_names, where, what)
        table = table.select(columns)
    return table


def prune_source(source: Datasource, columns: list[str] | None, row_filter: pc.Expression | None,
                 where: str) -> Datasource:
    """``source`` whose read tasks prune every table they read, in the task (formats without
    column statistics: CSV, JSON, text, binary files). Partitioning and each task's identity are
    unchanged, so an epoch's commit records stay valid."""
    if columns is None and row_filter is None:
        return source

    def plan(slots: int, override: int | None, target_bytes: int) -> list[ReadTask]:
        return [dataclasses.replace(task, read=_pruned(task.read, task.label, columns, row_filter, where))
                for task in source.plan(slots, override, target_bytes)]

    if row_filter is None:
        return dataclasses.replace(source, plan=plan)
    return dataclasses.replace(source, plan=plan, num_rows=None, meta_rows=None)  # rows known before: not after it


def _pruned(read: Callable[[], Iterator[pa.Table]], label: str, columns, row_filter, where: str):
    def pruned() -> Iterator[pa.Table]:
        for table in read():
            kept = prune_table(table, columns, row_filter, where, label)
            if kept.num_rows or not table.num_rows:  # a table the filter emptied is dropped, an empty one kept
                yield kept

    return pruned


def prune_reads(ds, columns, row_filter, where: str):
    """A ``read_*`` dataset (one read, nothing after it) whose read tasks prune what they read."""
    logical = list(ds._logical)
    if len(logical) != 1 or not isinstance(logical[0], Read):
        raise ValueError(f"{where}: read pruning applies to a read_* dataset, not to {ds!r}")
    read = logical[0]
    return Dataset([dataclasses.replace(read, datasource=prune_source(read.datasource, columns, row_filter, where))],
                   ds._context)


# -- a filter in a spec file (spark-submit) ---------------------------------------------------
_EXPRESSION_GLOBALS = {("pyarrow._compute", "Expression._deserialize"), ("pyarrow.lib", "py_buffer")}


class _ExpressionUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _EXPRESSION_GLOBALS:
            raise pickle.UnpicklingError(f"a row filter's pickle may hold only a pyarrow expression, "
                                         f"not {module}.{name}")
        return super().find_class(module, name)


def encode_filter(row_filter: pc.Expression | None) -> str | None:
    """The expression as text for a JSON spec: base64 of its pickle (pyarrow's own serialization)."""
    return None if row_filter is None else base64.b64encode(pickle.dumps(row_filter, protocol=5)).decode("ascii")


def decode_filter(text: str | None) -> pc.Expression | None:
    """`encode_filter`'s text back to the expression; anything but a pickled expression is refused."""
    if text is None:
        return None
    value = _ExpressionUnpickler(io.BytesIO(base64.b64decode(text, validate=True))).load()
    if not isinstance(value, pc.Expression):
        raise ValueError(f"the spec's row_filter is a {type(value).__name__}, not a pyarrow expression")
    return value
