"""``Dataset.count()`` from metadata, without running the plan, where the rows are known before any
task runs (Ray's ``Dataset._meta_count``).

Ray answers ``count()`` from its plan's metadata when the plan is a source alone: a Parquet read
sums its files' footer row counts, ``range(n)`` is ``n``, ``from_items`` and a materialized dataset
know their blocks' rows; anything after the source runs the plan. Here the same, and a ``limit(n)``
after such a source too (it keeps ``min(n, rows)``, nothing else). A transform, a row filter on the
read (``filter=``: the footers count rows the filter drops) or a custom source runs the plan, as before.

The footers are read on the driver, through the read's own filesystem (`parquet_meta.py`). A
footer that cannot be read, or a file whose schema is not the first file's, gives no count: the
plan then runs and its read fails naming the file, as it would have without this shortcut.
"""

from __future__ import annotations

from airflow_streambatch.engine.plan.logical import InputBlocks, Limit, Read


def meta_count(logical: list) -> int | None:
    """Rows of the plan ``logical`` known without running it, else None."""
    source, *rest = logical
    if not all(isinstance(op, Limit) for op in rest):
        return None
    if isinstance(source, InputBlocks):
        rows = sum(ref.num_rows for ref in source.blocks)
    elif isinstance(source, Read):
        known = source.datasource
        rows = known.num_rows if known.num_rows is not None else (known.meta_rows() if known.meta_rows else None)
    else:
        return None
    if rows is None:
        return None
    return min([rows, *(op.n for op in rest)])
