"""``repr(ds)`` in Ray Data 2.x's form, from what is known without running anything.

Ray prints the operators last first, each under the one after it, down to the source::

    Map(double)
    +- Dataset(num_rows=10, schema={id: int64})

and ``MaterializedDataset(num_blocks=3, num_rows=10, schema={id: int64})`` for a dataset whose
blocks exist (in files, or in the driver's memory for ``from_pandas``/``from_arrow``/``from_numpy``,
whose pandas columns show pandas dtypes such as ``float64``, as Ray shows a pandas block's).
A number of rows is known for ``range``/``from_items``, existing blocks and a
``read_parquet`` (its footers' row counts, without a row ``filter=``), and for a source that a
``count()`` of it ran (``_known_rows``, as Ray keeps what an execution learnt); ``?`` otherwise;
a schema for ``range``, for the output of a source that already ran here (``_known_schema``), from
a ``read_parquet``'s first footer (`parquet_meta.parquet_meta_schema`: the schema its read tasks give, as Ray
shows it from Parquet metadata), or from the header of a local block file ("Unknown schema"
otherwise, as Ray shows CSV, JSON, text and binary reads). Nothing is planned on Spark; nothing
read but footers and a block's schema, and a footer that cannot be read leaves ``?``.
"""

from __future__ import annotations

import pyarrow as pa

from airflow_streambatch.engine.plan.logical import InputBlocks, Limit, Read, Repartition, Transform
from airflow_streambatch.engine.plan.shuffle import MAP_SIDE, ShuffleRows
from airflow_streambatch.engine.worker.tensors import type_name

LINE_LIMIT, INDENT = 80, " " * 3  # Ray's SCHEMA_LINE_CHAR_LIMIT and indent


def dataset_repr(dataset) -> str:
    source, *ops = dataset._logical
    names = [name for name in map(_op_name, reversed(ops)) if name]
    lines = [name if depth == 0 else f"{INDENT * (depth - 1)}+- {name}" for depth, name in enumerate(names)]
    prefix = f"{INDENT * (len(names) - 1)}+- " if names else ""
    schema = dataset._known_schema if not ops else None
    counted = dataset._known_rows if not ops else None
    in_driver = getattr(dataset, "_in_driver_blocks", None) if not ops else None  # `MaterializedDataset.in_driver`
    source_line = _source_repr(type(dataset).__name__, source, schema, len(names), in_driver, counted)
    return "\n".join([*lines, prefix + source_line])


def _op_name(op) -> str | None:
    if isinstance(op, ShuffleRows) and op.stage == MAP_SIDE:
        return None  # half of RandomShuffle: Ray shows one operator
    if isinstance(op, Transform):
        return op.name
    if isinstance(op, Limit):
        return f"Limit[limit={op.n}]"
    if isinstance(op, Repartition):
        return op.reduce.name if op.reduce is not None else "Repartition"
    return type(op).__name__


def _source_repr(classname: str, source, schema: pa.Schema | None, depth: int, in_driver: int | None = None,
                 counted: int | None = None) -> str:
    rows, blocks, names = "?", None, type_name
    if isinstance(source, Read):
        blocks = in_driver
        if source.datasource.name == "FromPandas":
            names = _pandas_type_name  # Ray's blocks are the DataFrames: it shows their dtypes
        known_rows, known_schema = _from_metadata(source.datasource)
        known_rows = counted if known_rows is None else known_rows
        rows = "?" if known_rows is None else known_rows
        if schema is None:
            schema = known_schema
    elif isinstance(source, InputBlocks):
        rows = sum(ref.num_rows for ref in source.blocks)
        blocks = len(source.blocks) if classname == "MaterializedDataset" else None
        schema = schema if schema is not None else _block_schema(source.blocks)
    schema_str = "Unknown schema" if schema is None else (
        "{" + ", ".join(f"{field.name}: {names(field.type)}" for field in schema) + "}")
    params = ([f"num_blocks={blocks}"] if blocks is not None else []) + [f"num_rows={rows}", f"schema={schema_str}"]
    one_line = f"{classname}({', '.join(params)})"
    if len(one_line) <= LINE_LIMIT:
        return one_line
    pad = INDENT * depth
    return f"{classname}(" + ",".join(f"\n{pad}{INDENT}{p}" for p in params) + f"\n{pad})"


def _pandas_type_name(arrow_type: pa.DataType) -> str:
    """The pandas dtype an Arrow type reads back as (``float64``, ``object``), as Ray names the
    columns of a pandas block; the Arrow name where pandas has no plain dtype for it."""
    try:
        import numpy as np

        return str(np.dtype(arrow_type.to_pandas_dtype()))
    except (NotImplementedError, TypeError, ValueError):
        return type_name(arrow_type)


def _from_metadata(datasource) -> tuple[int | None, pa.Schema | None]:
    """A source's rows and schema as known before reading; a listing or footer that fails (a path
    that is gone) leaves them unknown here: the run reports it, a repr never raises."""
    if datasource.name == "Range":
        return datasource.num_rows, pa.schema([("id", pa.int64())])
    try:
        rows = datasource.num_rows if datasource.meta_rows is None else datasource.meta_rows()
        return rows, None if datasource.meta_schema is None else datasource.meta_schema()
    except (OSError, ValueError, pa.ArrowException):
        return None, None


def _block_schema(blocks) -> pa.Schema | None:
    """The schema in the header of the first block file this driver can open (never a remote one)."""
    for ref in blocks:
        if ref.location:
            return None
        try:
            with pa.memory_map(ref.path, "r") as source:
                return pa.ipc.open_file(source).schema
        except (OSError, pa.ArrowInvalid):
            return None
    return None
