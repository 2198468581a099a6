"""Sort and groupby's barrier: range-partition key-sorted blocks by key, one reduce task per range.

Its input blocks arrive sorted by the key (the map-side sort fused upstream, `plan/sort.py`).
Once all are in, as Ray Data's sort does, it samples the keys of every block, takes as
boundaries the keys at ``i / n`` of the sorted sample (``n``: one range per non-empty input
block, as Ray makes one output block per input block), or takes ``sort(boundaries=)``'s values
(`given_cuts`), and finds where each block crosses each boundary (NumPy's ``searchsorted`` for
one key of numbers or strings, else a binary search). A range is then made of row slices of
every block (no data moves in the driver), and its reduce task merges them (or aggregates
their groups). Rows whose key equals a boundary all go to the range after it, so a group of
equal keys is never split.

What the driver reads: the key columns of the sorted blocks, one block at a time, through the
run's block access. In local mode the blocks are memory-mapped and only the key columns' pages
are touched; on a cluster each block is fetched whole from its host once (counted in the run's
``driver_fetched_bytes``), and the key columns of all blocks are held until the cut is made.

Keys compare as Arrow's ``sort_indices`` orders them (`worker/sorting.py`): nulls last, and
NaNs after the values but before nulls, in either direction.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from airflow_streambatch.engine.execution.operators.repartition import RepartitionOperator
from airflow_streambatch.engine.protocol.blocks import BlockRef

SAMPLES_PER_BLOCK = 100  # keys sampled from each sorted block (evenly spaced, so a stratified sample)


class SortOperator(RepartitionOperator):
    read_block: Callable[[BlockRef], pa.Table] | None = None  # set by the executor (its ``read_output``)

    def _gathered(self) -> list[BlockRef]:
        return sorted(self.inputs, key=lambda ref: ref.order)  # the same cut on every run

    def _cut(self, blocks: list[BlockRef]) -> tuple[int, list[list[BlockRef]], dict[str, BlockRef]]:
        return range_cut(blocks, self.physical.keys, self.physical.descending, self.read_block,
                         self.physical.boundaries)


def compare_keys(a: tuple, b: tuple, descending: tuple[bool, ...]) -> int:
    """-1, 0 or 1 as Arrow's sort places key tuple ``a`` against ``b``."""
    for x, y, desc in zip(a, b, descending):
        rx, ry = _rank(x), _rank(y)
        if rx != ry:
            return -1 if rx < ry else 1
        if rx == 0 and x != y:
            return (1 if x < y else -1) if desc else (-1 if x < y else 1)
    return 0


def _rank(value) -> int:
    """0: a value; 1: NaN; 2: null (the last two come last in either direction)."""
    if value is None:
        return 2
    return 1 if isinstance(value, float) and math.isnan(value) else 0


def range_cut(blocks: list[BlockRef], keys: tuple[str, ...], descending: tuple[bool, ...],
              read: Callable[[BlockRef], pa.Table], given: tuple | None = None,
              ) -> tuple[int, list[list[BlockRef]], dict[str, BlockRef]]:
    """The number of ranges, the slices of each (in block order), and the block each slice is cut from.
    ``given``: ``sort(boundaries=)``'s values, cut at instead of sampled ones (`given_cuts`)."""
    filled = [ref for ref in blocks if ref.num_rows]
    if not keys or not filled:  # a global aggregate, or no rows: one range takes everything
        sliced_from = {ref.block_id: ref for ref in blocks}
        return 1, [list(blocks)], sliced_from
    if given is not None:
        cuts = {ref.block_id: given_cuts(read(ref).column(keys[0]), given, descending[0], keys[0]) for ref in filled}
        return len(given) + 1, *_sliced(filled, cuts, len(given) + 1)
    columns = {ref.block_id: read(ref).select(list(keys)) for ref in filled}
    order = functools.cmp_to_key(lambda a, b: compare_keys(a, b, descending))
    sample = sorted((key for j, ref in enumerate(filled) for key in _sample(columns[ref.block_id], j)), key=order)
    n = len(filled)
    boundaries: list[tuple] = []
    for i in range(1, n):
        candidate = sample[min(len(sample) - 1, i * len(sample) // n)]
        if not boundaries or compare_keys(boundaries[-1], candidate, descending) < 0:
            boundaries.append(candidate)
    cuts = {ref.block_id: _cuts(columns[ref.block_id], boundaries, descending) for ref in filled}
    return len(boundaries) + 1, *_sliced(filled, cuts, len(boundaries) + 1)


def _sliced(blocks: list[BlockRef], cuts: dict[str, list[int]], n: int
            ) -> tuple[list[list[BlockRef]], dict[str, BlockRef]]:
    """Each of ``n`` ranges as the slices of the blocks between their cuts, and each slice's block."""
    groups: list[list[BlockRef]] = [[] for _ in range(n)]
    sliced_from: dict[str, BlockRef] = {}
    for ref in blocks:
        bounds = [0] + cuts[ref.block_id] + [ref.num_rows]
        for j, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if lo < hi:
                piece = ref.slice(lo, hi - lo)
                groups[j].append(piece)
                sliced_from[piece.block_id] = ref
    return groups, sliced_from


def given_cuts(column: pa.ChunkedArray, boundaries: tuple, descending: bool, key: str) -> list[int]:
    """Where a block sorted by ``key`` crosses each of ``sort(boundaries=)``'s values, as Ray cuts: a row
    whose key is below boundary ``b`` sorts into a range before ``b``'s, a row at or above it into one
    after (range ``i`` holds ``[b[i-1], b[i])``); descending, the ranges come highest first. Nulls and
    NaNs sort last, so they fall into the last range either way."""
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise ValueError(f"sort(boundaries=...): the key column {key!r} holds {kind}; boundaries cut a column of "
                         "numbers (integers or floats), as in Ray Data")
    plain = column.slice(0, len(column) - column.null_count).to_numpy()
    if pa.types.is_floating(kind):
        plain = plain[: len(plain) - int(np.isnan(plain).sum())]  # NaNs sort after the numbers
    if not descending:
        return [int(c) for c in np.searchsorted(plain, np.asarray(boundaries), side="left")]
    at_or_above = len(plain) - np.searchsorted(plain[::-1], np.asarray(boundaries[::-1]), side="left")
    return [int(c) for c in at_or_above]


def _row(table: pa.Table, i: int) -> tuple:
    return tuple(table.column(k)[i].as_py() for k in range(table.num_columns))


def _sample(table: pa.Table, seed: int) -> list[tuple]:
    """One key at a random row of each of ``count`` equal strata of the sorted block, the same on every
    run (``seed``). Not a fixed row per stratum: every block's sample would then sit at the same
    quantiles, and with more ranges than samples per block the boundaries bunched at those quantiles
    (1,000 blocks of uniform keys gave ranges of 2,320 to 147,144 rows where 20,000 were due)."""
    count = min(table.num_rows, SAMPLES_PER_BLOCK)
    jitter = np.random.default_rng(seed).random(count)
    return [_row(table, int((i + jitter[i]) * table.num_rows / count)) for i in range(count)]


def _cuts(table: pa.Table, boundaries: list[tuple], descending: tuple[bool, ...]) -> list[int]:
    """Where the sorted ``table`` crosses each boundary: NumPy's ``searchsorted`` over a single key of
    plain numbers or strings (no nulls, no NaNs), else a binary search per boundary by `compare_keys`
    (500 blocks of 20,000 rows took 9.8 s in the binary search alone)."""
    if table.num_columns == 1:
        cuts = searchsorted_cuts(table.column(0), [b[0] for b in boundaries], descending[0])
        if cuts is not None:
            return cuts
    cuts, lo = [], 0
    for boundary in boundaries:  # the boundaries ascend, so each search starts where the last ended
        lo = _first_not_before(table, boundary, descending, lo)
        cuts.append(lo)
    return cuts


def searchsorted_cuts(column: pa.ChunkedArray, values: list, descending: bool) -> list[int] | None:
    """For each boundary value, the rows of the sorted ``column`` that sort before it; None where the
    column is not a single run of plain values NumPy orders as Arrow does (integers, floats without
    NaN, strings; no nulls). Boundaries that are null or NaN sort after every plain value."""
    kind = column.type
    if column.null_count or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                                 or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return None
    keys = column.to_numpy()
    if pa.types.is_floating(kind) and np.isnan(keys).any():
        return None
    plain = [v for v in values if _rank(v) == 0]
    wanted = np.array(plain, dtype=keys.dtype if keys.dtype != object else object)
    if descending:  # rows before v are those greater than v
        cuts = len(keys) - np.searchsorted(keys[::-1], wanted, side="right")
    else:
        cuts = np.searchsorted(keys, wanted, side="left")
    return [int(c) for c in cuts] + [len(keys)] * (len(values) - len(plain))


def _first_not_before(table: pa.Table, boundary: tuple, descending: tuple[bool, ...], lo: int = 0) -> int:
    """The first row of the sorted ``table`` from ``lo`` on that does not sort before ``boundary``."""
    hi = table.num_rows
    while lo < hi:
        mid = (lo + hi) // 2
        if compare_keys(_row(table, mid), boundary, descending) < 0:
            lo = mid + 1
        else:
            hi = mid
    return lo
