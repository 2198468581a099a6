"""``range_tensor``: Ray Data's source of test tensors, ``n`` rows whose ``data`` column holds an
array of ``shape`` filled with the row's index.

Why a module of its own: it is a source like ``range`` (read tasks cut the same way, rows known
before reading, so ``count()`` and ``random_sample``'s checks need no run), but its rows are
arrays: each read task builds its slice with NumPy and hands it to the engine's one conversion of
NumPy arrays to Arrow (`worker/batches.from_udf_output`), so its column type is the one
``from_numpy`` and ``map_batches`` give arrays of that shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa

from airflow_streambatch.engine.dataset import Dataset
from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.num_blocks_alias import with_parallelism
from airflow_streambatch.engine.plan.datasource import READ_BATCH_ROWS, Datasource, ReadTask, row_ranges
from airflow_streambatch.engine.plan.logical import Read
from airflow_streambatch.engine.worker.batches import from_udf_output


@with_parallelism
def range_tensor(n: int, *, shape: tuple[int, ...] = (1,), override_num_blocks: int | None = None) -> Dataset:
    """Rows ``0 .. n-1``, each a ``data`` column holding ``np.full(shape, i)`` (int64), as Ray's
    ``range_tensor``; ``take_batch()["data"]`` is an array of shape ``(rows, *shape)``."""
    check_positive_int(n, "range_tensor: n", allow_zero=True)
    check_positive_int(override_num_blocks, "range_tensor: override_num_blocks", allow_none=True)
    if not isinstance(shape, tuple) or not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ValueError(f"range_tensor: shape must be a non-empty tuple of positive integers, got {shape!r}")
    row_bytes = 8 * int(np.prod(shape))

    def plan(slots: int, override: int | None, target_bytes: int) -> list[ReadTask]:
        return [ReadTask(f"range_tensor[{lo}:{hi}]", row_bytes * (hi - lo), _read(lo, hi, shape),
                         f"range_tensor[{lo}:{hi}]{shape}")
                for lo, hi in row_ranges(n, row_bytes, slots, override, target_bytes)]

    return Dataset([Read(Datasource("RangeTensor", plan, num_rows=n), override_num_blocks)])


def _read(lo: int, hi: int, shape: tuple[int, ...]) -> Callable[[], Iterator[pa.Table]]:
    def read():
        for start in range(lo, hi, READ_BATCH_ROWS):
            ids = np.arange(start, min(hi, start + READ_BATCH_ROWS), dtype=np.int64)
            data = np.broadcast_to(ids.reshape(-1, *([1] * len(shape))), (len(ids), *shape))
            yield from_udf_output({"data": np.ascontiguousarray(data)}, "range_tensor")

    return read
