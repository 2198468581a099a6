"""Plan nodes of ``sort`` and ``groupby``: the logical `SortBy` and the transforms its tasks run.

`SortBy` plans as two steps (`planner.py`): a map side fused into the operator before it (each
block sorted by the key, `SortBlocks`, or for an aggregate each group's partials in key
order, `PartialAggregate`), then a barrier (`SortOp`, run by
`execution/operators/sort.py`) that range-partitions the sorted blocks by key and runs one
reduce task per key range: `SortBlocks` again for a sort, `AggregateGroups` or `MapGroups` for
a ``groupby``. A group never spans two ranges (rows equal to a boundary all go to the range
after it), so a reduce task sees whole groups. What the transforms run lives in
`worker/sorting.py`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from airflow_streambatch.engine.plan.logical import ResourceRequest, Transform
from airflow_streambatch.engine.worker import sorting
from airflow_streambatch.engine.worker.batches import DEFAULT_BATCH_FORMAT, check_batch_format

CPU_TASK = ResourceRequest.make("sort", num_cpus=1)


@dataclass
class SortBlocks(Transform):
    """Sorts each task's rows by ``keys`` (a map-side sort, or a sort's reduce task)."""

    keys: tuple[str, ...] = ()
    descending: tuple[bool, ...] = ()

    def apply(self, tables, env):
        return sorting.sort_tables(tables, self.keys, self.descending, self.name)


@dataclass
class PartialAggregate(Transform):
    """A ``groupby`` aggregate's map side: each group's partials over the task's rows, in key order."""

    keys: tuple[str, ...] = ()
    aggs: tuple = ()

    def apply(self, tables, env):
        return sorting.partial_aggregate(tables, self.keys, self.aggs, self.name)


@dataclass
class AggregateGroups(Transform):
    """A ``groupby`` reduce task: one row per group of its key range (`engine/aggregate.py`);
    ``merge``: its input is `PartialAggregate`'s partials."""

    keys: tuple[str, ...] = ()
    aggs: tuple = ()
    merge: bool = False

    def apply(self, tables, env):
        return sorting.aggregate_groups(tables, self.keys, self.aggs, self.name, self.merge)


@dataclass
class MapGroups(Transform):
    """A ``groupby(...).map_groups(fn)`` reduce task: ``fn`` over each group of its key range. Its
    ``compute`` (``num_cpus``, ``num_gpus``, ``resources``, ``concurrency``) is the reduce tasks'
    request; a class ``fn`` is built once per worker, as for ``map_batches``."""

    keys: tuple[str, ...] = ()
    fn: Any = None
    batch_format: str | None = DEFAULT_BATCH_FORMAT
    fn_args: tuple = ()
    fn_kwargs: dict = field(default_factory=dict)
    fn_constructor_args: tuple = ()
    fn_constructor_kwargs: dict = field(default_factory=dict)
    zero_copy_batch: bool = True  # Ray's default for map_groups: Arrow's own (read-only) memory

    def __post_init__(self):
        check_batch_format(self.batch_format, self.name)
        if not callable(self.fn):
            raise TypeError(f"{self.name}: fn must be callable, got {type(self.fn).__name__}")
        if not inspect.isclass(self.fn) and (self.fn_constructor_args or self.fn_constructor_kwargs):
            raise ValueError(f"{self.name}: fn_constructor_args/kwargs apply only when fn is a class")
        if not isinstance(self.zero_copy_batch, bool):
            raise TypeError(f"{self.name}: zero_copy_batch must be True or False, got {self.zero_copy_batch!r}")

    def apply(self, tables, env):
        return sorting.map_groups(tables, self, env)


@dataclass(frozen=True)
class SortBy:
    """Rows range-partitioned by ``keys`` across output blocks, each block's rows in key order,
    the blocks in key order; ``reduce`` runs in each range's task (None: a sort)."""

    keys: tuple[str, ...]
    descending: tuple[bool, ...]
    reduce: Transform | None = field(default=None, hash=False, compare=False)
    map: Transform | None = field(default=None, hash=False, compare=False)  # None: sort each block by the key
    boundaries: tuple | None = None  # ``sort(boundaries=)``: ranges cut at these values of the first key

    @property
    def label(self) -> str:
        return ",".join(self.keys) or "*"

    def map_side(self) -> SortBlocks | None:
        """The map side fused upstream: its own (a partial aggregate), else a sort of each block by the
        key (none without keys: one range takes every row)."""
        if self.map is not None:
            return self.map
        if not self.keys:
            return None
        return SortBlocks(f"SortBlocks[{self.label}]", CPU_TASK, keys=self.keys, descending=self.descending)

    def reduce_side(self) -> Transform:
        return self.reduce or SortBlocks(f"Sort[{self.label}]", CPU_TASK, keys=self.keys, descending=self.descending)


def with_map_sides(logical: list) -> list:
    """The logical chain with each `SortBy`'s map-side sort put before it, so the planner fuses it
    into the operator upstream as any transform."""
    out = []
    for op in logical:
        side = op.map_side() if isinstance(op, SortBy) else None
        if side is not None:
            out.append(side)
        out.append(op)
    return out
