"""``Dataset.groupby(key)``'s result: Ray Data's `GroupedData` (``ray.data.grouped_data``).

Every method returns a lazy `Dataset` whose plan ends in a `SortBy` barrier (`plan/sort.py`):
rows are range-partitioned by key and each reduce task aggregates (or maps) the whole groups of
its key range, so groups come out sorted by key, as Ray's do. An aggregate is partial first: each
map task reduces its rows to one row of partials per group, and the reduce task merges them
(an `AggregateFn` without ``merge`` sends whole groups instead). ``key=None`` makes one group of
every row (Ray's global aggregate): its one reduce task merges one row per map task.
``map_groups``' resource arguments (``num_gpus``, ``concurrency``, ...) become the reduce tasks' own.
"""

from __future__ import annotations

from airflow_streambatch.engine.aggregate import AggregateFn, Count, Max, Mean, Min, Std, Sum
from airflow_streambatch.engine.compute import concurrency_of
from airflow_streambatch.engine.plan.logical import ResourceRequest
from airflow_streambatch.engine.plan.sort import CPU_TASK, AggregateGroups, MapGroups, PartialAggregate, SortBy
from airflow_streambatch.engine.worker.batches import DEFAULT_BATCH_FORMAT


def key_columns(key, where: str) -> tuple[str, ...]:
    """``key`` (None, a column name or a list of names) as a tuple of names."""
    if key is None:
        return ()
    names = [key] if isinstance(key, str) else key
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{where}: key must be a column name or a non-empty list of column names, got {key!r}")
    return tuple(names)


def check_columns(dataset, names, where: str) -> None:
    """Ray's check: each name is a column of the dataset's schema (fetched, as Ray fetches it). Not where
    a transform quarantines rows: such a plan runs only as a write's (`plan/row_errors.py`), which then
    refuses a barrier after it, and the reduce tasks check the columns anyway."""
    if any(getattr(op, "on_error", None) == "quarantine" for op in dataset._logical):
        return
    schema = dataset.schema()
    if schema is None:
        return  # no blocks: nothing to check against, as in Ray
    for name in names:
        if name not in schema.names:
            raise ValueError(f"{where}: you specified the column {name!r}, but there's no such column in the "
                             f"dataset. The dataset has columns: {list(schema.names)}")


class GroupedData:
    """Rows grouped by ``key`` (Ray's `GroupedData`)."""

    def __init__(self, dataset, key):
        self._dataset = dataset
        self._keys = key_columns(key, "groupby")

    def __repr__(self) -> str:
        return f"GroupedData(dataset={self._dataset!r}, key={list(self._keys) or None!r})"

    def _grouped(self, reduce, partial=None) -> object:
        return self._dataset._with(SortBy(self._keys, (False,) * len(self._keys), reduce, partial))

    def aggregate(self, *aggs: AggregateFn):
        """One row per group: the key columns, then one column per aggregation (named as Ray names it)."""
        if not aggs:
            raise ValueError("aggregate: give at least one aggregation (such as Count() or Sum('x'))")
        for agg in aggs:
            if not isinstance(agg, AggregateFn):
                raise TypeError(f"aggregate: {agg!r} is not an AggregateFn (use ray.data.aggregate's names, here "
                                "airflow_streambatch.engine.aggregate)")
        names = [agg.name for agg in aggs]
        if len(set(names)) != len(names) or set(names) & set(self._keys):
            raise ValueError(f"aggregate: output columns must be distinct, got {self._keys + tuple(names)}")
        check_columns(self._dataset, self._keys + tuple(a.on for a in aggs if a.on is not None), "groupby")
        label, aggs = ",".join(self._keys) or "*", tuple(aggs)
        if not all(agg.mergeable for agg in aggs):  # an AggregateFn without merge: whole groups in the reduce task
            return self._grouped(AggregateGroups(f"Aggregate[{label}]", CPU_TASK, keys=self._keys, aggs=aggs))
        partial = PartialAggregate(f"PartialAggregate[{label}]", CPU_TASK, keys=self._keys, aggs=aggs)
        reduce = AggregateGroups(f"Aggregate[{label}]", CPU_TASK, keys=self._keys, aggs=aggs, merge=True)
        return self._grouped(reduce, partial)

    def count(self):
        return self.aggregate(Count())

    def _each(self, kind, on, **options):
        columns = [on] if isinstance(on, str) else on
        if columns is None:  # Ray: every column but the keys
            schema = self._dataset.schema()
            columns = [n for n in (schema.names if schema else []) if n not in self._keys]
        return self.aggregate(*[kind(c, **options) for c in columns])

    def sum(self, on=None, ignore_nulls: bool = True):
        return self._each(Sum, on, ignore_nulls=ignore_nulls)

    def min(self, on=None, ignore_nulls: bool = True):
        return self._each(Min, on, ignore_nulls=ignore_nulls)

    def max(self, on=None, ignore_nulls: bool = True):
        return self._each(Max, on, ignore_nulls=ignore_nulls)

    def mean(self, on=None, ignore_nulls: bool = True):
        return self._each(Mean, on, ignore_nulls=ignore_nulls)

    def std(self, on=None, ddof: int = 1, ignore_nulls: bool = True):
        return self._each(Std, on, ddof=ddof, ignore_nulls=ignore_nulls)

    def map_groups(self, fn, *, zero_copy_batch: bool = True, compute=None,
                   batch_format: str | None = DEFAULT_BATCH_FORMAT, fn_args=None, fn_kwargs=None,
                   fn_constructor_args=None, fn_constructor_kwargs=None, num_cpus: float | None = None,
                   num_gpus: float | None = None, resources: dict[str, float] | None = None,
                   concurrency: int | tuple | None = None, **unsupported):
        """``fn`` over each group's rows as one batch; its outputs, groups in key order. Runs in the
        barrier's reduce tasks, which take Ray's resource arguments as ``map_batches`` takes them:
        ``num_cpus``, ``num_gpus``, ``resources``, ``concurrency`` and ``compute``
        (``ActorPoolStrategy`` for a class, built once per worker with ``fn_constructor_args``/
        ``fn_constructor_kwargs``); by default one CPU each. Other remote args are refused."""
        if unsupported:
            raise TypeError(f"map_groups: {sorted(unsupported)} not supported here; the groups run in the groupby's "
                            "reduce tasks, which take num_cpus, num_gpus, resources, concurrency and compute")
        name = f"MapGroups[{getattr(fn, '__name__', type(fn).__name__)}]"
        concurrency = concurrency_of(name, fn, compute, concurrency)
        request = ResourceRequest.make(name, num_cpus, num_gpus, resources, concurrency, fn)
        check_columns(self._dataset, self._keys, "groupby")
        return self._grouped(MapGroups(
            name, request, keys=self._keys, fn=fn, batch_format=batch_format, fn_args=tuple(fn_args or ()),
            fn_kwargs=dict(fn_kwargs or {}), fn_constructor_args=tuple(fn_constructor_args or ()),
            fn_constructor_kwargs=dict(fn_constructor_kwargs or {}), zero_copy_batch=zero_copy_batch))
