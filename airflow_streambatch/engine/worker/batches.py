"""Batch formats: Arrow tables in and out of user functions, and re-batching.

Inside the engine every batch is a `pyarrow.Table`. User functions see the format
they asked for, with Ray Data's names and default: ``"default"`` and ``"numpy"`` (a dict
of column name to NumPy array), ``"pandas"``, ``"pyarrow"``, or ``None`` (the blocks'
own format, a `pyarrow.Table`), and may return any of them; anything else is an error
that names the operator.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from airflow_streambatch.engine.errors import BatchOutputError
from airflow_streambatch.engine.worker.tensors import column_to_numpy, numpy_to_arrow, rows_table

BATCH_FORMATS = ("default", "numpy", "pandas", "pyarrow", None)
DEFAULT_BATCH_FORMAT = "default"  # Ray Data's: a dict of NumPy arrays


def check_batch_format(batch_format: str | None, where: str) -> None:
    if batch_format not in BATCH_FORMATS:
        raise ValueError(f"{where}: unknown batch_format {batch_format!r}; use one of {BATCH_FORMATS}")


def to_format(table: pa.Table, batch_format: str | None):
    """The batch a user function receives."""
    if batch_format in ("pyarrow", None):
        return table
    if batch_format == "pandas":
        return table.to_pandas()
    return {name: column_to_numpy(table.column(name)) for name in table.column_names}


def from_udf_output(value: Any, operator: str) -> pa.Table:
    """Turn what a user function returned into a table, or say exactly what was wrong."""
    if isinstance(value, pa.Table):
        return value
    if isinstance(value, pa.RecordBatch):
        return pa.Table.from_batches([value])
    module = type(value).__module__
    if module.startswith("pandas") and type(value).__name__ == "DataFrame":
        return pa.Table.from_pandas(value, preserve_index=False)
    if isinstance(value, dict):
        try:
            return pa.table({k: numpy_to_arrow(v) for k, v in value.items()})
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError) as exc:
            raise BatchOutputError(f"{operator} returned a dict that is not a table of equal-length columns: "
                                   f"{exc}") from exc
    raise BatchOutputError(
        f"{operator} returned {type(value).__name__}; a batch function must return a "
        "pyarrow.Table, a pandas.DataFrame or a dict of column name to array"
    )


def rows_to_table(rows: list[dict], operator: str, keys=None) -> pa.Table:
    """Rows (dicts) a row function produced, as a table (`check_rows` first)."""
    check_rows(rows, operator, keys)
    return rows_table(rows)


def check_rows(rows: list[dict], operator: str, keys=None) -> None:
    """Every row must be a dict with the keys of the first one (or ``keys``, those of the rows
    the operator produced before): Arrow builds the columns from the first row, so a key only
    some rows have would be dropped, and a missing one filled with null, silently. One key-set
    comparison per row is all this costs.
    """
    if keys is None and rows and isinstance(rows[0], dict):
        keys = rows[0].keys()
    for row in rows:
        if not isinstance(row, dict):
            raise TypeError(f"{operator} must return dict rows, got {type(row).__name__}")
        if row.keys() != keys:
            raise ValueError(  # the first sentence is Ray Data's, which pipelines and tests match on
                "Current row has different columns compared to previous rows. "
                f"{operator} returned rows with different keys: {sorted(keys, key=str)} and {sorted(row, key=str)}. "
                "Every row must have the same keys (put None where a row has no value): otherwise the missing "
                "columns would be filled with nulls and the extra ones dropped"
            )


def rebatch(tables: Iterable[pa.Table], batch_size: int | None) -> Iterator[pa.Table]:
    """Yield tables of exactly ``batch_size`` rows (the last may be shorter).

    ``None`` passes each input table through whole (one batch per block).
    """
    if batch_size is None:
        for table in tables:
            if table.num_rows:
                yield table
        return
    pending: list[pa.Table] = []
    pending_rows = 0
    for table in tables:
        if not table.num_rows:
            continue
        pending.append(table)
        pending_rows += table.num_rows
        if pending_rows < batch_size:
            continue
        merged = pa.concat_tables(pending, promote_options="default")
        start = 0
        while merged.num_rows - start >= batch_size:
            yield merged.slice(start, batch_size)
            start += batch_size
        rest = merged.slice(start)
        pending, pending_rows = ([rest], rest.num_rows) if rest.num_rows else ([], 0)
    if pending_rows:
        yield pa.concat_tables(pending, promote_options="default")
