"""Datasets from data already in the driver's memory, with Ray Data's constructors:
``from_pandas``, ``from_arrow``, ``from_numpy`` and ``from_blocks``.

As in Ray Data, each input table (DataFrame, array) is one block and one input
partition, in the order given, and the result is a `MaterializedDataset` (its blocks exist:
in the driver's memory here, where Ray puts them in its object store), whose ``repr`` knows
its blocks, rows and schema. The data travels to the executors inside its read task, as
`from_items` rows do, so these suit data that fits in the driver.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa

from airflow_streambatch.engine.dataset import MaterializedDataset
from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.plan.datasource import Datasource, ReadTask
from airflow_streambatch.engine.plan.logical import Read
from airflow_streambatch.engine.worker.batches import from_udf_output


def from_arrow(tables, *, override_num_blocks: int | None = None) -> MaterializedDataset:
    """One block per `pyarrow.Table` (or `RecordBatch`): a table, or a list of them.
    ``override_num_blocks=n``: as Ray's, the tables' rows joined and cut into ``n`` blocks."""
    tables = _as_list(tables, (pa.Table, pa.RecordBatch))
    return _from_tables("FromArrow", _split(tables, override_num_blocks, "from_arrow"), "from_arrow")


def from_pandas(dfs, *, override_num_blocks: int | None = None) -> MaterializedDataset:
    """One block per `pandas.DataFrame`: a DataFrame, or a list of them (the index is dropped).
    ``override_num_blocks=n``: as Ray's, the frames' rows joined and cut into ``n`` blocks."""
    import pandas as pd

    dfs = _as_list(dfs, (pd.DataFrame,))
    for df in dfs:  # pyarrow would turn 1 into "1" silently; Ray refuses it
        wrong = [name for name in df.columns if not isinstance(name, str)]
        if wrong:
            raise ValueError(f"from_pandas: column names must be strings, as a Ray Data block's are; got {wrong!r}. "
                             "Rename them, e.g. df.columns = df.columns.astype(str)")
    return _from_tables("FromPandas", _split(dfs, override_num_blocks, "from_pandas"), "from_pandas")


def _split(blocks: list, num_blocks: int | None, where: str) -> list:
    """``blocks`` as they are, or (``num_blocks`` given) their rows in order cut into ``num_blocks``
    blocks whose sizes differ by at most one row, the larger first, as NumPy's ``array_split``
    cuts Ray's concatenated frames; with fewer rows than blocks, the last blocks are empty."""
    check_positive_int(num_blocks, f"{where}: override_num_blocks", allow_none=True)
    if num_blocks is None:
        return blocks
    table = pa.concat_tables([from_udf_output(block, where) for block in blocks], promote_options="default")
    base, extra = divmod(table.num_rows, num_blocks)
    starts = [i * base + min(i, extra) for i in range(num_blocks + 1)]
    return [table.slice(start, end - start) for start, end in zip(starts, starts[1:])]


def from_numpy(ndarrays) -> MaterializedDataset:
    """One block per NumPy array, in a ``data`` column (Ray Data's name); an array of more than one
    dimension becomes a column of fixed-shape rows."""
    arrays = _as_list(ndarrays, (np.ndarray,))
    return _from_tables("FromNumpy", [{"data": array} for array in arrays], "from_numpy")


def from_blocks(blocks: list) -> MaterializedDataset:
    """One block per item: pyarrow tables, pandas DataFrames or dicts of columns, as a UDF may return."""
    if not isinstance(blocks, (list, tuple)) or not blocks:
        raise TypeError(f"from_blocks expects a non-empty list of blocks, got {type(blocks).__name__}")
    return _from_tables("FromBlocks", list(blocks), "from_blocks")


def _as_list(value, kinds: tuple[type, ...]) -> list:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    wrong = [type(v).__name__ for v in items if not isinstance(v, kinds)]
    if not items or wrong:
        names = " or ".join(k.__name__ for k in kinds)
        raise TypeError(f"expected a {names} or a non-empty list of them, got {wrong or 'an empty list'}")
    return items


def _from_tables(name: str, blocks: list, where: str) -> MaterializedDataset:
    tables = [from_udf_output(block, where) for block in blocks]

    def plan(slots: int, override: int | None, target_bytes: int) -> list[ReadTask]:
        return [ReadTask(f"{where}[{i}]", table.nbytes, _read_table(table), _identity(table))
                for i, table in enumerate(tables)]

    schemas = {table.schema for table in tables if table.num_columns}
    schema = schemas.pop() if len(schemas) == 1 else None  # blocks of differing schemas: "Unknown schema"
    source = Datasource(name, plan, num_rows=sum(table.num_rows for table in tables),
                        meta_schema=lambda: schema, in_memory=True)
    return MaterializedDataset.in_driver(Read(source, None), len(tables))


def _read_table(table: pa.Table) -> Callable[[], Iterator[pa.Table]]:
    def read():
        yield table

    return read


def _identity(table: pa.Table) -> str:
    """What a commit records for this input: a hash of the table's bytes in Arrow's IPC format."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha1(sink.getvalue().to_pybytes()).hexdigest()[:16]
