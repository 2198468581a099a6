"""Joining blocks into one table as Ray Data does.

Why: blocks of one dataset need not share a schema. A source may type a column int64 in one
block and float64 in another (``from_arrow`` of two tables, a map whose output type follows
its input), and a barrier (``repartition``, ``random_shuffle``) must still put their rows in
one block. Ray unifies the schemas first, promoting types (int64 with float64 gives float64, a
null column takes the other's type) and filling a column some blocks lack with nulls
(``unify_schemas`` in Ray's ``arrow_ops/transform_pyarrow.py``); Arrow's permissive promotion
follows the same rules for the types this engine's blocks hold.

Two cases Arrow's ``concat_tables`` gets wrong are handled here too: tables with no columns
(``select_columns([])``), whose rows it loses, and tables with a column name twice
(``select_columns(["a", "b", "b"])``), which it refuses to unify even when the schemas are equal.
"""

from __future__ import annotations

import pyarrow as pa


def unify_schemas(schemas: list[pa.Schema]) -> pa.Schema:
    """One schema every one of ``schemas`` can be cast to; raises Arrow's error when two types
    of a column have none (string and int64)."""
    first = schemas[0]
    if all(s.equals(first) for s in schemas[1:]):
        return first
    return pa.unify_schemas(schemas, promote_options="permissive")


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns, in its order: cast, or nulls where ``table`` lacks one."""
    if table.schema.equals(schema):
        return table
    columns = [table.column(f.name).cast(f.type) if f.name in table.column_names
               else pa.nulls(table.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def unify_tables(tables: list[pa.Table]) -> list[pa.Table]:
    """``tables`` cast to one schema (`unify_schemas` of those with rows); tables without rows
    whose schema differs are dropped (they add nothing, and may hold types no cast reaches)."""
    with_rows = [t for t in tables if t.num_rows]
    if not with_rows:
        return tables
    schema = unify_schemas([t.schema for t in with_rows])
    return [conform(t, schema) for t in tables if t.num_rows or t.schema.equals(schema)]


def concat_tables(tables: list[pa.Table]) -> pa.Table:
    """``tables`` as one table, schemas unified as Ray does (see the module's docstring)."""
    tables = [t for t in tables if t.num_rows] or tables[:1]
    if len(tables) == 1:
        return tables[0]
    tables = unify_tables(tables)
    if tables[0].num_columns == 0:  # Arrow would lose the rows: keep their count
        return pa.table({"_": pa.nulls(sum(t.num_rows for t in tables))}).select([])
    return pa.concat_tables(tables)
