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

import pickle
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from airflow_streambatch.engine.worker import batches


def _joined(tables: Iterator[pa.Table]) -> pa.Table | None:
    """A task's input as one table (None: it had no rows and no schema)."""
    tables = [t for t in tables if t.num_columns]
    if not tables:
        return None
    return pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]


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
    """``[start, end)`` of each run of equal keys in a table sorted by ``keys`` (one run without keys).
    Nulls equal nulls and NaNs equal NaNs, as Ray Data groups them."""
    if table.num_rows == 0:
        return []
    if not keys:
        return [(0, table.num_rows)]
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
        return [(0, table.num_rows)]
    starts = [0] + [i + 1 for i in pc.indices_nonzero(change).to_pylist()] + [table.num_rows]
    return list(zip(starts, starts[1:]))


PARTIAL = "__partial_{}"  # a partial aggregation's column in a map task's output (one pickle per group)


def _keys_of(group: pa.Table, keys: tuple[str, ...]) -> tuple[list, Any]:
    """The group's key scalars, and its key as `AggregateFn.init` receives it (a value, a tuple, or None)."""
    scalars = [group.column(k)[0] for k in keys]
    key = scalars[0].as_py() if len(keys) == 1 else tuple(v.as_py() for v in scalars) or None
    return scalars, key


def _key_arrays(table: pa.Table, keys: tuple[str, ...], scalars: list[list]) -> dict[str, pa.Array]:
    return {k: pa.array([row[i].as_py() for row in scalars], type=table.schema.field(k).type)
            for i, k in enumerate(keys)}


def partial_aggregate(tables: Iterator[pa.Table], keys: tuple[str, ...], aggs: tuple, where: str) -> Iterator[pa.Table]:
    """The map side of a ``groupby`` aggregate: one row per group of this task's rows, its keys and each
    aggregation's partial (pickled), in key order, for the reduce task to merge."""
    table = _joined(tables)
    if table is None or table.num_rows == 0:
        return
    _check_columns(table, keys + tuple(a.on for a in aggs if a.on is not None), where)
    table = sort_table(table, keys, (False,) * len(keys))
    scalars, partials = [], [[] for _ in aggs]
    for start, end in group_ranges(table, keys):
        group = table.slice(start, end - start)
        row, key = _keys_of(group, keys)
        scalars.append(row)
        for i, agg in enumerate(aggs):
            partials[i].append(pickle.dumps(agg.partial(group, key)))
    columns = _key_arrays(table, keys, scalars)
    fields = [table.schema.field(k) for k in keys]
    for i, (agg, values) in enumerate(zip(aggs, partials)):
        columns[PARTIAL.format(i)] = pa.array(values, type=pa.binary())
        output = agg.output_type(table.schema)  # the reduce task sees partials only: it types its output by this
        meta = {b"output_type": pa.schema([pa.field("t", output)]).serialize().to_pybytes()} if output else None
        fields.append(pa.field(PARTIAL.format(i), pa.binary(), metadata=meta))
    yield pa.table(columns, schema=pa.schema(fields))


def _partial_output_type(table: pa.Table, i: int) -> pa.DataType | None:
    meta = table.schema.field(PARTIAL.format(i)).metadata or {}
    if b"output_type" not in meta:
        return None
    return pa.ipc.read_schema(pa.py_buffer(meta[b"output_type"])).field("t").type


def aggregate_groups(tables: Iterator[pa.Table], keys: tuple[str, ...], aggs: tuple, where: str,
                     merge: bool = False) -> Iterator[pa.Table]:
    """One row per group: its keys, then each aggregation's column (`engine/aggregate.py` builds ``aggs``),
    groups sorted by key. ``merge``: the rows are map tasks' partials (`partial_aggregate`); else the
    input's own rows."""
    table = _joined(tables)
    if table is None or table.num_rows == 0:
        return
    if not merge:
        _check_columns(table, keys + tuple(a.on for a in aggs if a.on is not None), where)
    table = sort_table(table, keys, (False,) * len(keys))
    scalars, values = [], [[] for _ in aggs]
    for start, end in group_ranges(table, keys):
        group = table.slice(start, end - start)
        row, key = _keys_of(group, keys)
        scalars.append(row)
        for i, agg in enumerate(aggs):
            if merge:
                parts = [pickle.loads(v) for v in group.column(PARTIAL.format(i)).to_pylist()]  # noqa: S301 - this run's
                values[i].append(agg.result(agg.merge_partials(parts)))
            else:
                values[i].append(agg.compute(group, key))
    out = _key_arrays(table, keys, scalars)
    for i, (agg, column) in enumerate(zip(aggs, values)):
        output = _partial_output_type(table, i) if merge else agg.output_type(table.schema)
        out[agg.name] = pa.array(column, type=output)
    yield pa.table(out)


def map_groups(tables: Iterator[pa.Table], keys: tuple[str, ...], fn: Any, batch_format: str | None,
               fn_args: tuple, fn_kwargs: dict, where: str) -> Iterator[pa.Table]:
    """``fn`` over each group's rows as one batch of ``batch_format``, groups in key order."""
    table = _joined(tables)
    if table is None:
        return
    _check_columns(table, keys, where)
    table = sort_table(table, keys, (False,) * len(keys))
    for start, end in group_ranges(table, keys):
        value = fn(batches.to_format(table.slice(start, end - start), batch_format), *fn_args, **fn_kwargs)
        out = batches.from_udf_output(value, where)
        if out.num_rows:
            yield out
