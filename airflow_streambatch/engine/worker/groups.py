"""The groups of a key-sorted table as one number per row, so aggregates run over all groups at once.

A ``groupby`` task sorts its rows by key (`sorting.py`); each run of equal keys is a group, and
`Groups` numbers them 0, 1, ... in row (so key) order. The built-in aggregates
(`engine/aggregate.py`) then reduce a column per group with one Arrow hash aggregation keyed by
that number (``pa.Table.group_by``) instead of a Python loop over groups: 2,000,000 groups of
one row each took 11.9 s through the loop. Grouping by the run number rather than by the key
columns keeps the runs' own notion of equal keys (nulls equal nulls, NaNs equal NaNs, 0.0 equals
-0.0) and works for any key type Arrow can sort.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def group_starts(table: pa.Table, keys: tuple[str, ...]) -> np.ndarray:
    """The first row of each run of equal keys in a table sorted by ``keys`` (one run without keys).
    Nulls equal nulls and NaNs equal NaNs, as Ray Data groups them."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    change = None
    for key in keys:
        column = table.column(key).combine_chunks()
        if pa.types.is_null(column.type):
            continue  # every value null: one run
        before, after = column.slice(0, len(column) - 1), column.slice(1)
        differs = pc.fill_null(pc.not_equal(before, after), False)
        both_null = pc.and_(pc.is_null(before), pc.is_null(after))
        one_null = pc.xor(pc.is_null(before), pc.is_null(after))
        differs = pc.and_(pc.or_(differs, one_null), pc.invert(both_null))
        if pa.types.is_floating(column.type):  # NaN != NaN, yet NaNs are one group
            differs = pc.and_(differs, pc.invert(pc.and_(pc.fill_null(pc.is_nan(before), False),
                                                         pc.fill_null(pc.is_nan(after), False))))
        change = differs if change is None else pc.or_(change, differs)
    if change is None:
        return np.zeros(1, dtype=np.int64)
    return np.concatenate(([0], np.flatnonzero(change.to_numpy(zero_copy_only=False)) + 1)).astype(np.int64)


class Groups:
    """Rows numbered by group: ``ids[row]`` is the row's group, 0 to ``count - 1``, ascending over the
    rows; ``starts[g]`` is group ``g``'s first row."""

    def __init__(self, table: pa.Table, keys: tuple[str, ...]):
        self.table, self.keys = table, keys
        self.starts = group_starts(table, keys)
        self.count = len(self.starts)
        self._sizes = np.diff(np.append(self.starts, table.num_rows))
        self.ids = np.repeat(np.arange(self.count, dtype=np.int64), self._sizes)

    def sizes(self) -> pa.Array:
        """Rows per group."""
        return pa.array(self._sizes)

    def ranges(self) -> list[tuple[int, int]]:
        """``[start, end)`` of each group's rows."""
        bounds = np.append(self.starts, self.table.num_rows).tolist()
        return list(zip(bounds, bounds[1:]))

    def key_columns(self) -> dict[str, pa.Array]:
        """Each key column with one value per group (as the group's first row holds it)."""
        starts = pa.array(self.starts)
        return {k: self.table.column(k).take(starts).combine_chunks() for k in self.keys}

    def key_values(self) -> list[Any]:
        """Each group's key as `AggregateFn.init` receives it: a value, a tuple, or None without keys."""
        if not self.keys:
            return [None] * self.count
        columns = [column.to_pylist() for column in self.key_columns().values()]
        return columns[0] if len(columns) == 1 else list(zip(*columns))

    def per_row(self, per_group: pa.Array) -> pa.Array:
        """A value per group spread to the group's rows."""
        return per_group.take(pa.array(self.ids))

    def aggregate(self, *specs: tuple) -> list[pa.Array]:
        """For each ``(values, function, options)`` (``values``: one per row; ``function``: an Arrow
        hash aggregate such as ``"sum"``, ``"min"``, ``"count"``), one value per group, in group order;
        all in one ``group_by``."""
        columns = {"group": pa.array(self.ids)}
        for i, (values, _, _) in enumerate(specs):
            columns[f"v{i}"] = values
        aggregations = [(f"v{i}", function, options) for i, (_, function, options) in enumerate(specs)]
        out = pa.table(columns).group_by("group", use_threads=False).aggregate(aggregations)
        order = pc.sort_indices(out.column("group"))  # group_by lists groups as they first appear: already in order
        return [out.column(f"v{i}_{function}").take(order).combine_chunks()
                for i, (_, function, _) in enumerate(specs)]

    def elements(self, lists: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, pa.Array]:
        """The values of a list per row (partial states), flattened, and the group of each value."""
        lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
        lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
        return np.repeat(self.ids, lengths), pc.list_flatten(lists)


def grouped_lists(ids: np.ndarray, values: pa.Array, count: int, distinct: bool = False) -> pa.ListArray:
    """One list per group ``0 .. count - 1`` of the ``values`` whose entry in ``ids`` is that group,
    sorted ascending (nulls, then NaNs, last, as Arrow sorts); ``distinct``: each value once (nulls
    count as one value, as do NaNs). A group without values gets an empty list. One sort (and for
    ``distinct`` one hash grouping on (group, value)) for every group at once."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    table = pa.table({"group": pa.array(ids, type=pa.int64()), "value": values})
    if distinct:
        table = table.group_by(["group", "value"], use_threads=False).aggregate([])
    table = table.sort_by([("group", "ascending"), ("value", "ascending")])
    sizes = np.bincount(table.column("group").to_numpy(), minlength=count) if table.num_rows else np.zeros(count)
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), table.column("value").combine_chunks())
