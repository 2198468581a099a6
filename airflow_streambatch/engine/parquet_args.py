"""Ray's extra arguments of the Parquet reads (``read_parquet`` and ``read_parquet_bulk``):
``batch_size=``, ``tensor_column_schema=`` and the deprecated ``_block_udf=``, checked and turned
into what a read task applies.

Why a module of its own: both Parquet reads take them alike, and what they do runs in the read
tasks, on the executors, so it must pickle: ``tensor_column_schema`` turns a column of raw NumPy
bytes (``arr.tobytes()``, C order) into a tensor column of this engine's type (nested fixed-size
lists, `worker/tensors.py`), then ``_block_udf`` (a function of a `pyarrow.Table`) is applied to
every table the read yields, as Ray applies it to each block a read task outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa

from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.plan.datasource import READ_BATCH_ROWS
from airflow_streambatch.engine.worker.tensors import numpy_to_arrow

_PARQUET_ARGS = frozenset({"batch_size", "_block_udf"})


def check_parquet_args(args: dict, where: str) -> tuple[int, Callable | None]:
    """``**arrow_parquet_args`` of a Parquet read: ``batch_size`` (rows pyarrow decodes at a time,
    Ray's scan argument; default ``READ_BATCH_ROWS``) and ``_block_udf``. Anything else is a
    `TypeError` naming it (this engine does not pass other scan options on)."""
    unknown = sorted(set(args) - _PARQUET_ARGS)
    if unknown:
        raise TypeError(f"{where}: unexpected argument(s) {unknown}; of Ray's arrow_parquet_args this engine takes "
                        f"{sorted(_PARQUET_ARGS)}")
    batch_size = args.get("batch_size", READ_BATCH_ROWS)
    check_positive_int(batch_size, f"{where}: batch_size")
    block_udf = args.get("_block_udf")
    if block_udf is not None and not callable(block_udf):
        raise TypeError(f"{where}: _block_udf must be a function of a pyarrow.Table, got {type(block_udf).__name__}")
    return batch_size, block_udf


def block_fn(tensor_column_schema: dict | None, block_udf: Callable | None,
             where: str) -> Callable[[pa.Table], pa.Table] | None:
    """What a read task applies to each table it yields (None: nothing): the tensor columns of
    ``tensor_column_schema`` (``{column: (dtype, shape)}``), then ``block_udf``, in Ray's order."""
    tensors = _check_tensor_schema(tensor_column_schema, where)
    if not tensors and block_udf is None:
        return None
    return _BlockFn(tensors, block_udf, where)


def _check_tensor_schema(schema: dict | None, where: str) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    if schema is None:
        return {}
    if not isinstance(schema, dict):
        raise TypeError(f"{where}: tensor_column_schema must be a dict of column -> (dtype, shape), "
                        f"got {type(schema).__name__}")
    checked = {}
    for name, spec in schema.items():
        try:
            dtype, shape = spec
            checked[name] = (np.dtype(dtype), tuple(int(d) for d in shape))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: tensor_column_schema[{name!r}] must be (dtype, shape), such as "
                             f"(np.float32, (2, 2)); got {spec!r}") from exc
    return checked


class _BlockFn:
    """A picklable function of a table (it travels to the executors inside the read task)."""

    def __init__(self, tensors: dict, block_udf: Callable | None, where: str):
        self.tensors, self.block_udf, self.where = tensors, block_udf, where

    def __call__(self, table: pa.Table) -> pa.Table:
        for name, (dtype, shape) in self.tensors.items():
            table = table.set_column(table.schema.get_field_index(name), name,
                                     _tensor_column(table, name, dtype, shape, self.where))
        if self.block_udf is not None:
            table = self.block_udf(table)
            if not isinstance(table, pa.Table):
                raise TypeError(f"{self.where}: _block_udf must return a pyarrow.Table, got {type(table).__name__}")
        return table


def _tensor_column(table: pa.Table, name: str, dtype: np.dtype, shape: tuple[int, ...], where: str) -> pa.Array:
    """The column's bytes as arrays of ``shape`` (Ray: ``np.ndarray(shape, buffer=..., dtype=...)``)."""
    if name not in table.column_names:
        raise ValueError(f"{where}: tensor_column_schema names column {name!r}, which the file lacks "
                         f"(it has {table.column_names})")
    column = table.column(name)
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise ValueError(f"{where}: tensor_column_schema column {name!r} is {column.type}, not the bytes of "
                         "serialized ndarrays (binary)")
    width = int(np.prod(shape)) * dtype.itemsize
    arrays = []
    for value in column.to_pylist():
        if value is None or len(value) != width:
            raise ValueError(f"{where}: a value of column {name!r} is "
                             f"{'null' if value is None else f'{len(value)} bytes'}, not the {width} bytes of an "
                             f"array of shape {shape} and dtype {dtype}")
        arrays.append(np.frombuffer(value, dtype=dtype).reshape(shape))
    stacked = np.stack(arrays) if arrays else np.empty((0, *shape), dtype=dtype)
    return numpy_to_arrow(stacked) if stacked.ndim > 1 else pa.array(stacked)


def applied(reader: Callable[..., Iterator[pa.Table]], fn: Callable[[pa.Table], pa.Table] | None):
    """``reader`` (one fragment -> tables) with ``fn`` applied to every table it yields."""
    if fn is None:
        return reader

    def read(fragment) -> Iterator[pa.Table]:
        for table in reader(fragment):
            yield fn(table)

    return read
