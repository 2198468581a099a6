"""Ray Data's ``sort``, ``groupby`` and ``aggregate`` on `Dataset` (distributed: `plan/sort.py`).

``sort`` plans a map-side sort of each block, then a barrier that range-partitions the sorted
blocks by sampled key boundaries (or the caller's ``boundaries``) and one reduce task per range
(`execution/operators/sort.py`): the output blocks are in key order and every consumer
(``take_all``, ``iter_rows``, ``iter_batches``, ``to_pandas``, writes) takes them in that order.
Column names are checked against the schema when called, as Ray checks them (a run of the
pipeline up to its first block, unless the schema is known).
"""

from __future__ import annotations

import math

from airflow_streambatch.engine.grouped_data import GroupedData, check_columns, key_columns
from airflow_streambatch.engine.plan.logical import Limit
from airflow_streambatch.engine.plan.sort import SortBy


class DatasetSorting:
    """Mixed into `Dataset`; relies on its ``_with``, ``schema`` and ``take_all``."""

    def sort(self, key, descending=False, boundaries=None):
        """Rows sorted by ``key`` (a column or a list of columns); ``descending`` a bool or one per key.
        Nulls come last in either direction, NaNs just before them, as Ray Data sorts. ``boundaries``
        (numbers): output blocks cut at these values of the first key instead of at sampled keys,
        one block per range, as Ray's ``boundaries`` (`execution/operators/sort.py`)."""
        keys = key_columns(key, "sort")
        given = sort_boundaries(boundaries)
        if not keys:
            raise ValueError("sort: key must name at least one column")
        if isinstance(descending, bool):
            flags = (descending,) * len(keys)
        elif isinstance(descending, (list, tuple)) and all(isinstance(d, bool) for d in descending):
            if len(descending) != len(keys):
                raise ValueError(f"sort: the length of descending ({len(descending)}) does not match the length of "
                                 f"the key ({len(keys)})")
            flags = tuple(descending)
        else:
            raise ValueError(f"sort: descending must be a bool or a list of bools, got {descending!r}")
        check_columns(self, keys, "sort")
        return self._with(SortBy(keys, flags, boundaries=given))

    def groupby(self, key) -> GroupedData:
        """Rows grouped by ``key`` (a column, a list of columns, or None: one group of all rows)."""
        return GroupedData(self, key)

    def aggregate(self, *aggs) -> dict | None:
        """Ray's ``Dataset.aggregate``: every aggregation over all rows, as ``{name: value}``; None
        for a dataset without rows."""
        rows = GroupedData(self, None).aggregate(*aggs).take_all()
        return rows[0] if rows else None


def sort_boundaries(boundaries) -> tuple | None:
    """``sort(boundaries=)`` checked: numbers, sorted and each once (None or empty: sampled, as in Ray)."""
    if boundaries is None or (isinstance(boundaries, (list, tuple)) and not boundaries):
        return None
    if not isinstance(boundaries, (list, tuple)) or not all(
            isinstance(b, (int, float)) and not isinstance(b, bool) and not math.isnan(b) for b in boundaries):
        raise ValueError(f"sort: boundaries must be a list of numbers (values of the first key at which output "
                         f"blocks are cut), got {boundaries!r}")
    return tuple(sorted(set(boundaries)))


def limited_after_sort(logical: list) -> bool:
    """Whether a limit follows a sort: then the run keeps order (`execution/ordering.py`), so
    ``sort(k).limit(n)`` keeps the first ``n`` rows in key order, as in Ray, not the first to arrive."""
    sorts = [i for i, op in enumerate(logical) if isinstance(op, SortBy)]
    return bool(sorts) and any(isinstance(op, Limit) for op in logical[sorts[0] + 1:])
