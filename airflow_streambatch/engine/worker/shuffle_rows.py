"""The row permutation of ``random_shuffle``, run inside tasks on the executors.

Ray's shuffle (its ``ShuffleTaskSpec``) permutes each map task's block before cutting it
into one slice per output block, and permutes each reduce task's joined slices again. A
permutation needs all of a task's rows at once, so this concatenates the task's input:
a shuffle task holds one block, as Ray's does. The generator is seeded by the shuffle's
seed and the task's stable key (the same inputs give the same key on every run, see
`execution/operators/map.task_key`), so a seeded shuffle gives the same order each run.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from airflow_streambatch.engine.worker.unify import concat_tables


def permuted(tables: Iterator[pa.Table], seed: int | None, stage: int, task_key: str) -> Iterator[pa.Table]:
    """All rows of ``tables`` as one table in a random order (``seed=None``: fresh entropy)."""
    parts = [t for t in tables if t.num_rows or t.num_columns]
    if not parts:
        return
    table = concat_tables(parts)  # blocks typed int64 and float64 give float64, as in Ray (`unify.py`)
    key = None if seed is None else [seed, stage, zlib.crc32(task_key.encode())]
    yield table.take(pa.array(np.random.default_rng(key).permutation(table.num_rows)))
