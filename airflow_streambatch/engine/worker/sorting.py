"""What ``sort`` and ``groupby`` run on executors: sort a task's rows, aggregate or map its groups.

A sort's map tasks sort each block by the key (`sort_tables`); after the barrier each reduce
task holds one key range of every sorted block and sorts them again (the slices are sorted
runs, so Arrow's sort does little work) or, for a ``groupby``, splits them into groups and
aggregates them (`aggregate_groups`) or hands each group to the user's function
(`map_groups`). The order is Arrow's ``sort_indices``: nulls, and after the values NaNs, come
last in either direction, as in Ray Data; the driver's boundary search
(`execution/operators/sort.py`) compares keys the same way.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_streambatch.engine.worker import batches, udf
from airflow_streambatch.engine.worker.groups import Groups, group_starts


def _joined(tables: Iterator[pa.Table], promote: str = "default") -> pa.Table | None:
    """A task's input as one table (None: it had no rows and no schema)."""
    tables = [t for t in tables if t.num_columns]
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options=promote) if len(tables) > 1 else tables[0]


def _check_columns(table: pa.Table, columns: tuple[str, ...], where: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"{where}: there is no column {missing[0]!r} in the dataset; its columns are "
                         f"{table.column_names}")


def sort_table(table: pa.Table, keys: tuple[str, ...], descending: tuple[bool, ...]) -> pa.Table:
    """``table``'s rows sorted by ``keys`` (stable, so equal keys keep their order)."""
    if not keys or table.num_rows < 2:
        return table
    order = [(k, "descending" if d else "ascending") for k, d in zip(keys, descending)]
    return table.take(pc.sort_indices(table, sort_keys=order))


def sort_tables(tables: Iterator[pa.Table], keys: tuple[str, ...], descending: tuple[bool, ...],
                where: str) -> Iterator[pa.Table]:
    table = _joined(tables)
    if table is None:
        return
    _check_columns(table, keys, where)
    yield sort_table(table, keys, descending)


def group_ranges(table: pa.Table, keys: tuple[str, ...]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of equal keys in a table sorted by ``keys`` (one run without keys)."""
    starts = group_starts(table, keys).tolist()
    return list(zip(starts, starts[1:] + [table.num_rows]))


PARTIAL = "__partial_{}.{}"  # aggregation i's partial state column (`AggregateFn.states`) in a map task's output


def partial_aggregate(tables: Iterator[pa.Table], keys: tuple[str, ...], aggs: tuple, where: str) -> Iterator[pa.Table]:
    """The map side of a ``groupby`` aggregate: one row per group of this task's rows, its keys and each
    aggregation's partial state, in key order, for the reduce task to merge. Blocks whose column
    types differ by width (int64 and the float64 pandas makes of ints with a None) are widened, as
    pandas' concat of Ray's blocks widens them."""
    table = _joined(tables, "permissive")
    if table is None or table.num_rows == 0:
        return
    _check_columns(table, keys + tuple(a.on for a in aggs if a.on is not None), where)
    table = sort_table(table, keys, (False,) * len(keys))
    groups = Groups(table, keys)
    out = groups.key_columns()
    for i, agg in enumerate(aggs):
        out.update({PARTIAL.format(i, name): state for name, state in agg.states(table, groups).items()})
    yield pa.table(out)


def aggregate_groups(tables: Iterator[pa.Table], keys: tuple[str, ...], aggs: tuple, where: str,
                     merge: bool = False) -> Iterator[pa.Table]:
    """One row per group: its keys, then each aggregation's column (`engine/aggregate.py` builds ``aggs``),
    groups sorted by key. ``merge``: the rows are map tasks' partials (`partial_aggregate`; states of
    differing types, as from an integer block and a float one, are promoted to a common type); else
    the input's own rows."""
    table = _joined(tables, "permissive")  # rows of blocks typed int64 and float64 too, as for partials
    if table is None or table.num_rows == 0:
        return
    if not merge:
        _check_columns(table, keys + tuple(a.on for a in aggs if a.on is not None), where)
    table = sort_table(table, keys, (False,) * len(keys))
    groups = Groups(table, keys)
    out = groups.key_columns()
    for i, agg in enumerate(aggs):
        if merge:
            prefix = PARTIAL.format(i, "")
            states = {name[len(prefix):]: table.column(name) for name in table.column_names if name.startswith(prefix)}
            out[agg.name] = agg.merged(states, groups)
        else:
            out[agg.name] = agg.compute(table, groups)
    yield pa.table(out)


def map_groups(tables: Iterator[pa.Table], transform: Any, env: udf.TaskEnv) -> Iterator[pa.Table]:
    """``transform.fn`` (a `MapGroups`; a class: this worker's instance, `udf.py`) over each group's rows
    as one batch of its ``batch_format``, groups in key order; a generator's outputs each in turn."""
    table = _joined(tables)
    if table is None:
        return
    keys, where = transform.keys, transform.name
    _check_columns(table, keys, where)
    table = sort_table(table, keys, (False,) * len(keys))
    fn = udf.udf_for(transform, env)
    for start, end in group_ranges(table, keys):
        value = fn(udf.udf_batch(table.slice(start, end - start), transform), *transform.fn_args,
                   **transform.fn_kwargs)
        for item in (value if inspect.isgenerator(value) else [value]):
            out = batches.from_udf_output(item, where)
            if out.num_rows:
                yield out
