"""Tensor columns: NumPy arrays of one shape per row, as Ray Data's tensor columns hold them.

Why a module of its own: Ray Data code puts arrays in rows (``map`` returning
``{"image": np.zeros((28, 28))}``, ``from_items`` of arrays) and gets arrays back from rows
(``take``, ``iter_rows``, the row a ``map`` function receives). Here such a column is
Arrow's nested fixed-size lists, one level per dimension after the first (a batch of shape
``(n, 2, 3)`` is ``n`` rows of 2 lists of 3): plain Arrow, which Parquet, Spark and pandas
read without an extension type to register. This module is the one place arrays become that
type and come back, for batches and rows alike.

A column is a tensor column when its type is fixed-size lists (nested or not) of numbers or
booleans; a variable-length list column stays a list of Python values, as in Ray.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def tensor_type(shape: tuple[int, ...], dtype: pa.DataType) -> pa.DataType:
    """The column type of arrays of ``shape`` with elements of ``dtype``."""
    for size in reversed(shape):
        dtype = pa.list_(dtype, size)
    return dtype


def tensor_shape(dtype: pa.DataType) -> tuple[tuple[int, ...], pa.DataType] | None:
    """``(shape, element type)`` of a tensor column's type; None for any other type."""
    shape = []
    while pa.types.is_fixed_size_list(dtype):
        shape.append(dtype.list_size)
        dtype = dtype.value_type
    numeric = pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype)
    return (tuple(shape), dtype) if shape and numeric else None


def type_name(dtype: pa.DataType) -> str:
    """A column type as Ray prints it: ``numpy.ndarray(shape=(2, 3), dtype=int64)`` for a tensor."""
    tensor = tensor_shape(dtype)
    if tensor is None:
        return str(dtype)
    shape, element = tensor
    return f"numpy.ndarray(shape={shape}, dtype={np.dtype(element.to_pandas_dtype()).name})"


def numpy_to_arrow(values) -> pa.Array:
    """A column from an array (an ``(n, *shape)`` array becomes ``n`` tensors of ``shape``)."""
    if isinstance(values, np.ndarray) and values.ndim > 1:
        array = pa.array(np.ascontiguousarray(values).reshape(-1))
        for size in reversed(values.shape[1:]):
            array = pa.FixedSizeListArray.from_arrays(array, size)
        return array
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values
    if isinstance(values, np.ndarray) and values.dtype == object and any(isinstance(v, np.ndarray) for v in values):
        # arrays of several shapes (``np.array([a, b], dtype=object)``): nested lists, one per row
        return pa.array([v.tolist() if isinstance(v, np.ndarray) else v for v in values])
    return pa.array(values)


def column_to_numpy(column: pa.ChunkedArray) -> np.ndarray:
    """A column as one array: ``(n, *shape)`` for a tensor column, without a Python value per
    element; lists of other lengths or elements become an array of objects."""
    tensor = tensor_shape(column.type)
    if tensor is not None and column.null_count == 0:
        values = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        for _ in tensor[0]:
            values = values.flatten()  # flatten, unlike .values, honours a sliced array's offset
        return values.to_numpy(zero_copy_only=False).reshape(len(column), *tensor[0])
    if pa.types.is_fixed_size_list(column.type) or pa.types.is_list(column.type):
        values = column.to_pylist()
        try:
            return np.asarray(values)
        except ValueError:
            return np.asarray(values, dtype=object)
    return column.to_numpy(zero_copy_only=False)


def table_rows(table: pa.Table) -> list[dict]:
    """The rows of a table as dicts, a tensor column's values as (writable) arrays."""
    tensors = {name for name, dtype in zip(table.column_names, table.schema.types) if tensor_shape(dtype)}
    if not tensors:
        return table.to_pylist()
    columns = [list(np.require(column_to_numpy(table.column(name)), requirements="W")) if name in tensors
               else table.column(name).to_pylist() for name in table.column_names]
    return [dict(zip(table.column_names, values)) for values in zip(*columns)]


def rows_table(rows: list[dict]) -> pa.Table:
    """A table of dict rows (all with the same keys); a column whose values are arrays of one
    shape becomes a tensor column, of several shapes nested lists."""
    first = rows[0] if rows else {}
    if not any(isinstance(value, np.ndarray) and value.ndim for value in first.values()):
        return pa.Table.from_pylist(rows)
    columns = {}
    for name in first:
        values = [row[name] for row in rows]
        if all(isinstance(v, np.ndarray) and v.ndim for v in values) and len({v.shape for v in values}) == 1:
            columns[name] = numpy_to_arrow(np.stack(values))
        else:
            columns[name] = pa.array([v.tolist() if isinstance(v, np.ndarray) else v for v in values])
    return pa.table(columns)
