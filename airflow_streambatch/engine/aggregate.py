"""Ray Data's ``ray.data.aggregate`` names: `Count`, `Sum`, `Min`, `Max`, `Mean`, `Std`, `AbsMax`,
`Quantile`, `Unique` and the accumulator-style `AggregateFn`, for ``groupby(...).aggregate(...)``
and ``Dataset.aggregate``.

Each names its output column as Ray does (``count()``, ``sum(x)``, ``mean(x)``; ``alias_name``
overrides it) and follows Ray's null rules: with ``ignore_nulls=True`` (the default, but for
`Count`) nulls are skipped and a group of only nulls gives None; with ``ignore_nulls=False`` a
null in the group makes the result None. `Std` of fewer than two values is 0.0, as in Ray.
All run on executors (`worker/sorting.py`) over a task's key-sorted rows numbered by group
(`worker/groups.py`): a map task computes every group's partial state (``states``), the
groupby's reduce task merges the partials of each group and finishes them (``merged``), or
without map-side partials computes the result from the rows (``compute``). The built-ins do
each step for all groups at once with Arrow (`Quantile` and `Unique` keep each group's values, or
distinct values, as one list per group: `worker/groups.py`'s ``grouped_lists``); an `AggregateFn`
loops over the groups in Python.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_streambatch.engine.worker.groups import Groups, grouped_lists

VALID, NULLS = pc.CountOptions(mode="only_valid"), pc.CountOptions(mode="only_null")


class AggregateFn:
    """Ray's accumulator-style aggregation: ``init(key)``, then ``accumulate_row(acc, row)`` per row
    or ``accumulate_block(acc, block)`` once (a `pyarrow.Table`), ``merge(a, b)`` of two partial
    accumulators, ``finalize(acc)``. With ``merge``, map tasks accumulate their share of each group
    and the reduce task merges the partials; without it, the reduce task accumulates whole groups.

    Every aggregation here answers the same three calls over a task's rows numbered by group:
    ``states`` (each group's partial as columns, one row per group, which a map task sends on),
    ``merged`` (the result per group from partial rows of several map tasks) and ``compute`` (the
    result per group from the rows themselves). Here each group's accumulator is one pickle."""

    on: str | None = None

    def __init__(self, init: Callable[[Any], Any], merge: Callable[[Any, Any], Any] | None = None,
                 accumulate_row: Callable[[Any, dict], Any] | None = None,
                 accumulate_block: Callable[[Any, pa.Table], Any] | None = None,
                 finalize: Callable[[Any], Any] | None = None, name: str | None = None):
        if (accumulate_row is None) == (accumulate_block is None):
            raise ValueError("AggregateFn: give exactly one of accumulate_row and accumulate_block")
        if not isinstance(name, str):
            raise TypeError(f"AggregateFn: name must be a string (the output column), got {name!r}")
        self.init, self.merge, self.finalize = init, merge, finalize or (lambda acc: acc)
        self.accumulate_row, self.accumulate_block, self.name = accumulate_row, accumulate_block, name

    @property
    def mergeable(self) -> bool:
        """Whether partials of one group can be merged (map-side partial aggregation)."""
        return self.merge is not None

    def states(self, table: pa.Table, groups: Groups) -> dict[str, pa.Array]:
        return {"acc": pa.array([pickle.dumps(acc) for acc in self._accumulated(table, groups)], type=pa.binary())}

    def merged(self, states: dict[str, pa.ChunkedArray], groups: Groups) -> pa.Array:
        partials = [pickle.loads(v) for v in states["acc"].to_pylist()]  # noqa: S301 - pickled by this run's tasks
        results = []
        for start, end in groups.ranges():
            acc = partials[start]
            for other in partials[start + 1:end]:
                acc = self.merge(acc, other)
            results.append(self.finalize(acc))
        return pa.array(results)

    def compute(self, table: pa.Table, groups: Groups) -> pa.Array:
        return pa.array([self.finalize(acc) for acc in self._accumulated(table, groups)])

    def _accumulated(self, table: pa.Table, groups: Groups) -> list:
        """Each group's accumulator over its rows."""
        accs = []
        for (start, end), key in zip(groups.ranges(), groups.key_values()):
            acc, group = self.init(key), table.slice(start, end - start)
            if self.accumulate_block is not None:
                accs.append(self.accumulate_block(acc, group))
                continue
            for row in group.to_pylist():
                acc = self.accumulate_row(acc, row)
            accs.append(acc)
        return accs


class _OnColumn(AggregateFn):
    """A built-in over one column ``on``, computed for every group at once with Arrow's hash aggregates
    keyed by the group number. Its state per group: ``valid`` and ``nulls`` (counts of its non-null
    and null values), then its value state, by the hash aggregate ``function`` that both computes
    and merges it (a sum of sums, a min of mins; `Std` keeps a mean and M2 instead). The three
    steps: `states` over rows, `merge_states` over partial rows, `finish` (Ray's null rules)."""

    label = ""
    function: str | None = None
    mergeable = True

    def __init__(self, on: str | None = None, ignore_nulls: bool = True, alias_name: str | None = None):
        if on is not None and not isinstance(on, str):
            raise TypeError(f"{type(self).__name__}: on must be a column name, got {on!r}")
        if on is None and not isinstance(self, Count):
            raise ValueError(f"{type(self).__name__}: on= must name the column to aggregate")
        self.on, self.ignore_nulls = on, ignore_nulls
        self.name = alias_name or f"{self.label}({on or ''})"

    def states(self, table, groups):
        column = self._values(table)
        value = [(column, self.function, None)] if self.function else []
        states = dict(zip(("valid", "nulls", self.function), groups.aggregate(
            (column, "count", VALID), (column, "count", NULLS), *value)))
        if self.function and pa.types.is_null(column.type):  # a block of only nulls: typed by the other blocks
            states[self.function] = pa.nulls(groups.count)
        return states

    def merge_states(self, states: dict, groups: Groups) -> dict[str, pa.Array]:
        value = [(states[self.function], self.function, None)] if self.function else []
        return dict(zip(("valid", "nulls", self.function), groups.aggregate(
            (states["valid"], "sum", None), (states["nulls"], "sum", None), *value)))

    def finish(self, states: dict) -> pa.Array:
        """The result per group: None where the group has no values, or (without ``ignore_nulls``) a null."""
        value = self._final(states)
        dropped = pc.equal(states["valid"], 0)
        if not self.ignore_nulls:
            dropped = pc.or_(dropped, pc.greater(states["nulls"], 0))
        return pc.if_else(dropped, pa.scalar(None, value.type), value)

    def merged(self, states, groups):
        return self.finish(self.merge_states(states, groups))

    def compute(self, table, groups):
        return self.finish(self.states(table, groups))

    def _final(self, states: dict) -> pa.Array:
        return states[self.function]

    def _values(self, table: pa.Table) -> pa.ChunkedArray:
        """The values aggregated: the column ``on``."""
        return table.column(self.on)


class Count(_OnColumn):
    """Rows of the group (``on`` with ``ignore_nulls=True``: its non-null values), as ``count()``."""

    label = "count"

    def __init__(self, on: str | None = None, ignore_nulls: bool = False, alias_name: str | None = None):
        super().__init__(on, ignore_nulls, alias_name)

    def states(self, table, groups):
        if self.on is None:
            return {"valid": groups.sizes(), "nulls": pa.array(np.zeros(groups.count, dtype=np.int64))}
        return super().states(table, groups)

    def finish(self, states):
        if self.on is not None and self.ignore_nulls:
            return states["valid"]
        return pc.add(states["valid"], states["nulls"])


class Sum(_OnColumn):
    label, function = "sum", "sum"


class Min(_OnColumn):
    label, function = "min", "min"


class Max(_OnColumn):
    label, function = "max", "max"


class Mean(Sum):
    label = "mean"

    def _final(self, states):
        return pc.divide(states["sum"].cast(pa.float64()), states["valid"].cast(pa.float64()))


class Std(_OnColumn):
    """The standard deviation with ``ddof`` (default 1, the sample's); 0.0 for a single value (NaN
    where ``ddof`` leaves no degrees of freedom). Partials are ``(count, mean, M2)`` as Ray keeps
    them, merged by Chan et al.'s formula over all of a group's partials at once: the mean weighted
    by counts, and M2 = sum(M2_j) + sum(n_j * (mean_j - mean) ** 2)."""

    label = "std"

    def __init__(self, on: str | None = None, ddof: int = 1, ignore_nulls: bool = True, alias_name: str | None = None):
        super().__init__(on, ignore_nulls, alias_name)
        self.ddof = ddof

    def states(self, table, groups):
        values = table.column(self.on).cast(pa.float64())
        valid, nulls, total = groups.aggregate((values, "count", VALID), (values, "count", NULLS),
                                               (values, "sum", None))
        mean = pc.divide(total, valid.cast(pa.float64()))  # null for a group without values
        deviation = pc.subtract(values, groups.per_row(mean))
        (m2,) = groups.aggregate((pc.multiply(deviation, deviation), "sum", None))
        return {"valid": valid, "nulls": nulls, "mean": mean, "m2": m2}

    def merge_states(self, states, groups):
        count = states["valid"].cast(pa.float64())
        valid, nulls, weighted = groups.aggregate((states["valid"], "sum", None), (states["nulls"], "sum", None),
                                                  (pc.multiply(count, states["mean"]), "sum", None))
        mean = pc.divide(weighted, valid.cast(pa.float64()))
        shift = pc.subtract(states["mean"], groups.per_row(mean))
        (m2,) = groups.aggregate((pc.add(states["m2"], pc.multiply(count, pc.multiply(shift, shift))), "sum", None))
        return {"valid": valid, "nulls": nulls, "mean": mean, "m2": m2}

    def _final(self, states):
        count = states["valid"].cast(pa.float64())
        freedom = pc.subtract(count, float(self.ddof))
        spread = pc.if_else(pc.greater(freedom, 0.0), pc.sqrt(pc.divide(states["m2"], freedom)), float("nan"))
        return pc.if_else(pc.less(count, 2.0), 0.0, spread)


class AbsMax(Max):
    """The largest absolute value, as ``abs_max(x)`` (a max of ``abs(x)``, so partials merge as maxima);
    the column's own type."""

    label = "abs_max"

    def _values(self, table):
        column = table.column(self.on)
        return column if pa.types.is_null(column.type) else pc.abs(column)


def _plain(column: pa.ChunkedArray) -> pa.Array:
    """Which values count: not null, and not NaN (Ray's ``is_null`` takes a NaN for a null)."""
    plain = pc.is_valid(column)
    if pa.types.is_floating(column.type):
        plain = pc.and_(plain, pc.invert(pc.fill_null(pc.is_nan(column), True)))
    return plain.combine_chunks() if isinstance(plain, pa.ChunkedArray) else plain


class Quantile(_OnColumn):
    """The ``q``-quantile (0.5: the median) as ``quantile(x)``, found as Ray finds it: over the group's
    sorted values ``v`` at ``k = (n - 1) * q``, ``v[k]`` where ``k`` is whole, else
    ``v[floor(k)] * (ceil(k) - k) + v[ceil(k)] * (k - floor(k))`` rounded to 5 decimals. Nulls and
    NaNs (both nulls to Ray) are skipped, or with ``ignore_nulls=False`` make the result None.
    Numbers give float64 (Ray gives the same number, an int where ``v[k]`` of ints needs no
    interpolation); other sortable types (strings, dates) work where none is needed. The partial
    state is the group's values, one list per group, so every value reaches the reduce task, as
    every value reaches Ray's accumulator; all groups are sorted and cut at once."""

    label = "quantile"

    def __init__(self, on: str | None = None, q: float = 0.5, ignore_nulls: bool = True,
                 alias_name: str | None = None):
        super().__init__(on, ignore_nulls, alias_name)
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 <= q <= 1:
            raise ValueError(f"Quantile: q must be a number between 0 and 1, got {q!r}")
        self.q = float(q)

    def states(self, table, groups):
        column = table.column(self.on).combine_chunks()
        plain = _plain(column)
        (valid,) = groups.aggregate((plain.cast(pa.int64()), "sum", None))
        values = grouped_lists(groups.ids[plain.to_numpy(zero_copy_only=False)], column.filter(plain), groups.count)
        return {"valid": valid, "nulls": pc.subtract(groups.sizes(), valid), "values": values}

    def merge_states(self, states, groups):
        valid, nulls = groups.aggregate((states["valid"], "sum", None), (states["nulls"], "sum", None))
        values = grouped_lists(*groups.elements(states["values"]), groups.count)
        return {"valid": valid, "nulls": nulls, "values": values}

    def _final(self, states):
        lists = states["values"]
        sizes = pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int64)
        values = pc.list_flatten(lists)
        numeric = any(check(values.type) for check in (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal))
        kind = pa.float64() if numeric else values.type
        if len(values) == 0:
            return pa.nulls(len(sizes), kind)
        k = np.maximum(sizes - 1, 0) * self.q
        low, high = np.floor(k), np.ceil(k)
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        last = len(values) - 1
        at_low = values.take(pa.array(np.minimum(starts + low.astype(np.int64), last)))
        blended = (low != high) & (sizes > 0)
        if not numeric:
            if blended.any():
                raise TypeError(f"{self.name}: the quantile falls between two values of type {values.type}, which "
                                "cannot be interpolated; use a column of numbers or a q that hits a value")
            return at_low
        at_high = values.take(pa.array(np.minimum(starts + high.astype(np.int64), last)))
        out = at_low.cast(pa.float64()).to_numpy(zero_copy_only=False).copy()
        mixed = out * (high - k) + at_high.cast(pa.float64()).to_numpy(zero_copy_only=False) * (k - low)
        out[blended] = [round(x, 5) for x in mixed[blended].tolist()]  # Python's round, as Ray's
        return pa.array(out, type=pa.float64())


class Unique(AggregateFn):
    """Each group's distinct values as one list, as ``unique(x)`` (Ray's output: a list per group).
    ``ignore_nulls=False`` (Ray's default for `Unique`) keeps a null as one of the values; ``True``
    drops nulls. The list is sorted (nulls last) where Ray's order is arbitrary. Each map task
    sends its distinct values per group; the reduce task takes the distinct values of those."""

    mergeable = True

    def __init__(self, on: str | None = None, ignore_nulls: bool = False, alias_name: str | None = None):
        if not isinstance(on, str):
            raise ValueError(f"Unique: on= must name the column to aggregate, got {on!r}")
        self.on, self.ignore_nulls = on, ignore_nulls
        self.name = alias_name or f"unique({on})"

    def states(self, table, groups):
        return {"values": self._distinct(groups.ids, table.column(self.on), groups.count)}

    def merged(self, states, groups):
        return self._distinct(*groups.elements(states["values"]), groups.count)

    def compute(self, table, groups):
        return self.states(table, groups)["values"]

    def _distinct(self, ids: np.ndarray, values, count: int) -> pa.ListArray:
        values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        if self.ignore_nulls and values.null_count:
            keep = pc.is_valid(values)
            ids, values = ids[keep.to_numpy(zero_copy_only=False)], values.filter(keep)
        return grouped_lists(ids, values, count, distinct=True)


__all__ = ["AbsMax", "AggregateFn", "Count", "Max", "Mean", "Min", "Quantile", "Std", "Sum", "Unique"]
