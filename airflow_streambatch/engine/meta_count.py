"""``Dataset.count()`` from metadata, without running the plan, where the rows are known before any
task runs (Ray's ``Dataset._meta_count``).

Ray answers ``count()`` from its plan's metadata when the plan is a source alone: a Parquet read
sums its files' footer row counts, ``range(n)`` is ``n``, ``from_items`` and a materialized dataset
know their blocks' rows; anything after the source runs the plan. Here the same, and a ``limit(n)``
after such a source too (it keeps ``min(n, rows)``, nothing else). A transform, a row filter on the
read (``filter=``: the footers count rows the filter drops) or a custom source runs the plan, as before.

The footers are read on the driver through the filesystem the read itself uses (``filesystem=``,
else the path's scheme), a few at a time in threads, since on an object store each is a round trip.
A footer that cannot be read, or a file whose schema is not the first file's, gives no count: the
plan then runs and its read fails naming the file, as it would have without this shortcut.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_streambatch.engine.plan.datasource import expand_paths
from airflow_streambatch.engine.plan.logical import InputBlocks, Limit, Read
from airflow_streambatch.engine.read_options import FileOptions

FOOTER_THREADS = 16  # footers fetched at once: each is one or two small ranged reads at a file's end


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


def parquet_meta_rows(paths, suffixes: tuple[str, ...], opts: FileOptions,
                      row_filter) -> Callable[[], int | None] | None:
    """What `read_parquet` knows of its rows before reading: the sum of the listed files' footer
    row counts; None (nothing known) with a row filter."""
    if row_filter is not None:
        return None

    def rows() -> int | None:
        files = [path for path, _ in expand_paths(paths, suffixes, **opts.listing())]
        return footer_rows(files, opts)

    return rows


def footer_rows(files: list[str], opts: FileOptions) -> int | None:
    """The rows the files' footers count, or None when a footer is unreadable or a file's schema
    differs from the first file's (the read would fail on it)."""
    if not files:
        return 0
    with ThreadPoolExecutor(max_workers=min(FOOTER_THREADS, len(files)), thread_name_prefix="parquet-footer") as pool:
        footers = list(pool.map(lambda path: _footer(path, opts), files))
    if any(footer is None for footer in footers):
        return None
    first = footers[0][1]
    if not all(schema.equals(first) for _, schema in footers):
        return None
    return sum(rows for rows, _ in footers)


def _footer(path: str, opts: FileOptions) -> tuple[int, pa.Schema] | None:
    try:
        with opts.open_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            return parquet.metadata.num_rows, parquet.schema_arrow
    except (OSError, pa.ArrowException):
        return None
