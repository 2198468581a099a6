"""Ray Data's tensor-column names (``ray.data.extensions.tensor_extension``), for code that builds
or checks a tensor column's type.

Ray stores arrays of one shape per row in an Arrow extension type of its own; this engine stores
them as nested fixed-size lists (`worker/tensors.py`), plain Arrow. So ``ArrowTensorType(shape,
dtype)`` here returns that `pyarrow.DataType`, which a tensor column of the dataset has (its
schema compares equal to one built with it), and ``isinstance(t, ArrowTensorType)`` says whether
``t`` is a tensor column's type. There is one representation, so ``ArrowTensorTypeV2`` is the same.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from airflow_streambatch.engine.worker.tensors import numpy_to_arrow, tensor_shape, tensor_type


class _TensorTypeCheck(type):
    def __instancecheck__(cls, instance) -> bool:
        return isinstance(instance, pa.DataType) and tensor_shape(instance) is not None


class ArrowTensorType(metaclass=_TensorTypeCheck):
    """``ArrowTensorType(shape, dtype)``: the column type of arrays of ``shape`` with elements of ``dtype``."""

    def __new__(cls, shape: tuple[int, ...], dtype: pa.DataType) -> pa.DataType:
        shape = tuple(shape)
        if not shape or not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape):
            raise ValueError(f"ArrowTensorType: shape must be a non-empty tuple of positive integers, got {shape!r}")
        return tensor_type(tuple(int(d) for d in shape), dtype)


ArrowTensorTypeV2 = ArrowTensorType


class ArrowTensorArray:
    """``ArrowTensorArray.from_numpy(array)``: an ``(n, *shape)`` array as a tensor column of ``n`` rows."""

    @staticmethod
    def from_numpy(array) -> pa.Array:
        array = np.asarray(array)
        if array.ndim < 2:
            raise ValueError(f"ArrowTensorArray.from_numpy: an array of shape (rows, *shape) is needed, got "
                             f"shape {array.shape}")
        return numpy_to_arrow(array)
