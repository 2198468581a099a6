"""Ray Data's iteration arguments: ``drop_last``, the local shuffle buffer and prefetching.

``iter_batches(local_shuffle_buffer_size=n)`` works as Ray Data documents it: rows are
gathered into a buffer, and a batch is cut only once the buffer holds at least ``n`` rows
beyond it; the buffer is shuffled (with ``local_shuffle_seed``, the same way every run) before
batches are cut from it, so a row may leave in any batch while at least ``n`` rows wait
behind. At the end the rest is shuffled and cut too. ``drop_last=True`` drops a last
batch shorter than ``batch_size``.

Prefetching: the engine's executor already runs ahead of the consumer (its tasks keep
producing blocks, bounded by ``DataContext.memory_limit``, while the consumer works on a
batch), which is what Ray's ``prefetch_batches``/``prefetch_blocks`` ask for; the values
are checked and otherwise have no further effect.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa

from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.worker.batches import rebatch


def check_iteration_args(where: str, *, batch_size: int | None, drop_last: bool = False,
                         local_shuffle_buffer_size: int | None = None, local_shuffle_seed: int | None = None,
                         prefetch_batches: int = 1, prefetch_blocks: int = 0) -> None:
    """Refuse values Ray Data refuses, naming the argument."""
    check_positive_int(batch_size, f"{where}: batch_size", allow_none=True)
    check_positive_int(prefetch_batches, f"{where}: prefetch_batches", allow_zero=True)
    check_positive_int(prefetch_blocks, f"{where}: prefetch_blocks", allow_zero=True)
    check_positive_int(local_shuffle_buffer_size, f"{where}: local_shuffle_buffer_size", allow_none=True)
    if not isinstance(drop_last, bool):
        raise TypeError(f"{where}: drop_last must be True or False, got {drop_last!r}")
    if local_shuffle_seed is not None and (isinstance(local_shuffle_seed, bool)
                                           or not isinstance(local_shuffle_seed, int)):
        raise TypeError(f"{where}: local_shuffle_seed must be an integer or None, got {local_shuffle_seed!r}")
    if local_shuffle_buffer_size is not None and batch_size is None:
        raise ValueError(f"{where}: local_shuffle_buffer_size needs a batch_size (batch_size=None gives whole "
                         "blocks, which a local shuffle cannot cut); set batch_size")


def batches(tables: Iterable[pa.Table], batch_size: int | None, *, drop_last: bool = False,
            local_shuffle_buffer_size: int | None = None, local_shuffle_seed: int | None = None) -> Iterator[pa.Table]:
    """Tables of ``batch_size`` rows cut from ``tables``, shuffled through a buffer when
    ``local_shuffle_buffer_size`` is given; the last, shorter one dropped with ``drop_last``."""
    if local_shuffle_buffer_size is None:
        cut = rebatch(tables, batch_size)
    else:
        cut = _shuffled(tables, batch_size, local_shuffle_buffer_size, np.random.default_rng(local_shuffle_seed))
    for batch in cut:
        if drop_last and batch_size is not None and batch.num_rows < batch_size:
            return  # only ever the last batch
        yield batch


def _shuffled(tables: Iterable[pa.Table], batch_size: int, buffer_rows: int,
              rng: np.random.Generator) -> Iterator[pa.Table]:
    buffer: list[pa.Table] = []
    held = 0
    for table in tables:
        if not table.num_rows:
            continue
        buffer.append(table)
        held += table.num_rows
        if held < buffer_rows + batch_size:
            continue
        mixed = _shuffle(buffer, rng)
        ready = (held - buffer_rows) // batch_size  # batches that leave at least buffer_rows behind
        for i in range(ready):
            yield mixed.slice(i * batch_size, batch_size)
        rest = mixed.slice(ready * batch_size)
        buffer, held = [rest], rest.num_rows
    if held:
        mixed = _shuffle(buffer, rng)
        for start in range(0, held, batch_size):
            yield mixed.slice(start, batch_size)


def _shuffle(tables: list[pa.Table], rng: np.random.Generator) -> pa.Table:
    merged = pa.concat_tables(tables, promote_options="default")
    return merged.take(pa.array(rng.permutation(merged.num_rows)))
