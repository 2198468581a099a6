"""The column-wise join of ``zip``, run inside the barrier's tasks on the executors.

A zip task's inputs are, in order, the slices of each dataset that hold the same rows by
position: ``k`` datasets, each contributing the same number of rows ``R`` (the driver cut
them so, `dataset_combine.py`). So the task tells the datasets apart by rows alone: the
first ``R`` rows are the first dataset's, the next ``R`` the second's, and so on.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa


def zipped(tables: Iterator[pa.Table], datasets: int) -> Iterator[pa.Table]:
    parts = [t for t in tables if t.num_rows]
    total = sum(t.num_rows for t in parts)
    if not total:
        return
    if total % datasets:
        raise ValueError(f"zip: a task got {total} rows for {datasets} datasets; each must give as many")
    rows, result, at = total // datasets, None, 0
    for d in range(datasets):
        mine, wanted = [], rows
        while wanted:
            table = parts[at]
            if table.num_rows > wanted:
                raise ValueError(f"zip: a slice of dataset {d} crosses the rows of the next one")
            mine.append(table)
            wanted -= table.num_rows
            at += 1
        side = pa.concat_tables(mine, promote_options="default").combine_chunks()
        result = side if result is None else append_columns(result, side)
    yield result


def append_columns(left: pa.Table, right: pa.Table) -> pa.Table:
    """``right``'s columns after ``left``'s, a name already taken renamed ``name_1``, ``name_2``...
    (the first free one), as Ray's block zip renames them."""
    for name, column in zip(right.column_names, right.columns):
        new, i = name, 1
        while new in left.column_names:
            new, i = f"{name}_{i}", i + 1
        left = left.append_column(new, column)
    return left
