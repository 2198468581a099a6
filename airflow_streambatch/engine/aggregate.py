"""Ray Data's ``ray.data.aggregate`` names: `Count`, `Sum`, `Min`, `Max`, `Mean`, `Std` and the
accumulator-style `AggregateFn`, for ``groupby(...).aggregate(...)`` and ``Dataset.aggregate``.

Each names its output column as Ray does (``count()``, ``sum(x)``, ``mean(x)``; ``alias_name``
overrides it) and follows Ray's null rules: with ``ignore_nulls=True`` (the default, but for
`Count`) nulls are skipped and a group of only nulls gives None; with ``ignore_nulls=False`` a
null in the group makes the result None. `Std` of fewer than two values is 0.0, as in Ray.
All run on executors (`worker/sorting.py`): a map task computes each group's partial over its
rows, the groupby's reduce task merges the partials of a group and finishes it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


class AggregateFn:
    """Ray's accumulator-style aggregation: ``init(key)``, then ``accumulate_row(acc, row)`` per row
    or ``accumulate_block(acc, block)`` once (a `pyarrow.Table`), ``merge(a, b)`` of two partial
    accumulators, ``finalize(acc)``. With ``merge``, map tasks accumulate their share of each group
    and the reduce task merges the partials; without it, the reduce task accumulates whole groups.

    Every aggregation here has the same three steps: ``partial`` (one group's rows in one task),
    ``merge_partials`` and ``result``; ``compute`` is the three over one whole group."""

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

    def partial(self, group: pa.Table, key: Any = None) -> Any:
        acc = self.init(key)
        if self.accumulate_block is not None:
            return self.accumulate_block(acc, group)
        for row in group.to_pylist():
            acc = self.accumulate_row(acc, row)
        return acc

    def merge_partials(self, partials: list) -> Any:
        acc = partials[0]
        for other in partials[1:]:
            acc = self.merge(acc, other)
        return acc

    def result(self, acc: Any) -> Any:
        return self.finalize(acc)

    def compute(self, group: pa.Table, key: Any = None) -> Any:
        return self.result(self.partial(group, key))

    def output_type(self, schema: pa.Schema) -> pa.DataType | None:
        return None  # inferred from the values


class _OnColumn(AggregateFn):
    """A built-in over one column ``on``. Its partial is ``(nulls, valid values, state of the valid
    values or None)``."""

    label = ""
    mergeable = True

    def __init__(self, on: str | None = None, ignore_nulls: bool = True, alias_name: str | None = None):
        if on is not None and not isinstance(on, str):
            raise TypeError(f"{type(self).__name__}: on must be a column name, got {on!r}")
        if on is None and not isinstance(self, Count):
            raise ValueError(f"{type(self).__name__}: on= must name the column to aggregate")
        self.on, self.ignore_nulls = on, ignore_nulls
        self.name = alias_name or f"{self.label}({on or ''})"

    def partial(self, group: pa.Table, key: Any = None) -> tuple:
        column = group.column(self.on)
        valid = len(column) - column.null_count
        return column.null_count, valid, self._state(column) if valid else None

    def merge_partials(self, partials: list) -> tuple:
        states = [state for _, _, state in partials if state is not None]
        return (sum(p[0] for p in partials), sum(p[1] for p in partials),
                self._merge(states) if states else None)

    def result(self, acc: tuple) -> Any:
        nulls, valid, state = acc
        if (nulls and not self.ignore_nulls) or not valid:
            return None
        return self._final(state, valid)

    def _state(self, column: pa.ChunkedArray) -> Any:
        raise NotImplementedError

    def _merge(self, states: list) -> Any:
        raise NotImplementedError

    def _final(self, state: Any, valid: int) -> Any:
        return state


class Count(_OnColumn):
    """Rows of the group (``on`` with ``ignore_nulls=True``: its non-null values), as ``count()``."""

    label = "count"

    def __init__(self, on: str | None = None, ignore_nulls: bool = False, alias_name: str | None = None):
        super().__init__(on, ignore_nulls, alias_name)

    def partial(self, group, key=None):
        return group.num_rows, group.num_rows - (group.column(self.on).null_count if self.on is not None else 0)

    def merge_partials(self, partials):
        return sum(p[0] for p in partials), sum(p[1] for p in partials)

    def result(self, acc):
        rows, valid = acc
        return valid if self.on is not None and self.ignore_nulls else rows

    def output_type(self, schema):
        return pa.int64()


class Sum(_OnColumn):
    label = "sum"

    def _state(self, column):
        return pc.sum(column).as_py()

    def _merge(self, states):
        return sum(states[1:], states[0])

    def output_type(self, schema):
        return pc.sum(pa.array([], type=schema.field(self.on).type)).type


class Min(_OnColumn):
    label = "min"

    def _state(self, column):
        return pc.min(column).as_py()

    def _merge(self, states):
        return min(states)

    def output_type(self, schema):
        return schema.field(self.on).type


class Max(Min):
    label = "max"

    def _state(self, column):
        return pc.max(column).as_py()

    def _merge(self, states):
        return max(states)


class Mean(_OnColumn):
    label = "mean"

    def _state(self, column):
        return pc.sum(column).as_py()

    def _merge(self, states):
        return sum(states[1:], states[0])

    def _final(self, state, valid):
        return state / valid

    def output_type(self, schema):
        return pa.float64()


class Std(_OnColumn):
    """The standard deviation with ``ddof`` (default 1, the sample's); 0.0 for a single value. Partials
    are ``(count, mean, M2)``, merged with Chan et al.'s formula, as Ray merges them."""

    label = "std"

    def __init__(self, on: str | None = None, ddof: int = 1, ignore_nulls: bool = True, alias_name: str | None = None):
        super().__init__(on, ignore_nulls, alias_name)
        self.ddof = ddof

    def _state(self, column):
        values = pc.drop_null(column).to_numpy().astype("float64")
        mean = float(values.mean())
        return len(values), mean, float(((values - mean) ** 2).sum())

    def _merge(self, states):
        count, mean, m2 = states[0]
        for n, m, q in states[1:]:
            total = count + n
            delta = m - mean
            mean, m2, count = mean + delta * n / total, m2 + q + delta * delta * count * n / total, total
        return count, mean, m2

    def _final(self, state, valid):
        count, _, m2 = state
        return 0.0 if count < 2 else math.sqrt(m2 / (count - self.ddof))

    def output_type(self, schema):
        return pa.float64()


__all__ = ["AggregateFn", "Count", "Max", "Mean", "Min", "Std", "Sum"]
