"""What a ``read_parquet`` knows before it reads, from its files' footers: the rows they count
(``count()`` without a run, `meta_count.py`) and the read's output schema (``repr(ds)``,
`dataset_repr.py`), as Ray's Parquet datasource knows both from metadata
(``Dataset(num_rows=6, schema={one: int64, two: string})`` before anything runs).

The footers are read on the driver through the filesystem the read itself uses (``filesystem=``,
else the path's scheme), a few at a time in threads, since on an object store each is a round trip.
A footer that cannot be read, or a file whose schema is not the first file's, gives no count: the
plan then runs and its read fails naming the file, as it would have without this shortcut. The
schema is the first file's columns, then its partition columns and ``path`` as the scan adds them,
narrowed by ``columns=`` (`parquet_ranges.read_schema`, where the read tasks' scan schema comes from).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_streambatch.engine.parquet_ranges import read_schema
from airflow_streambatch.engine.plan.datasource import expand_paths
from airflow_streambatch.engine.read_options import FileOptions

FOOTER_THREADS = 16  # footers fetched at once: each is one or two small ranged reads at a file's end


def parquet_meta_rows(paths, suffixes: tuple[str, ...], opts: FileOptions,
                      row_filter) -> Callable[[], int | None] | None:
    """What `read_parquet` knows of its rows before reading: the sum of the listed files' footer
    row counts; None (nothing known, nothing listed) with a row filter, which drops rows they count."""
    if row_filter is not None:
        return None

    def rows() -> int | None:
        files = [path for path, _ in expand_paths(paths, suffixes, **opts.listing())]
        footers = read_footers(files, opts)
        return None if footers is None else sum(count for count, _ in footers)

    return rows


def parquet_meta_schema(paths, suffixes: tuple[str, ...], opts: FileOptions,
                        columns: list[str] | None) -> Callable[[], pa.Schema | None]:
    """The schema `read_parquet`'s read tasks give, from its first listed file's footer (None when
    there is no file or its footer cannot be read): Ray's schema from Parquet metadata."""

    def schema() -> pa.Schema | None:
        files = [path for path, _ in expand_paths(paths, suffixes, **opts.listing())]
        footers = read_footers(files[:1], opts)
        return read_schema(footers[0][1], files[0], opts, columns) if footers else None

    return schema


def read_footers(files: list[str], opts: FileOptions) -> list[tuple[int, pa.Schema]] | None:
    """Each file's (rows, schema) from its footer, a few at a time in threads; None when one is
    unreadable or a file's schema differs from the first file's."""
    if not files:
        return []
    with ThreadPoolExecutor(max_workers=min(FOOTER_THREADS, len(files)), thread_name_prefix="parquet-footer") as pool:
        footers = list(pool.map(lambda path: _footer(path, opts), files))
    if any(footer is None for footer in footers):
        return None
    first = footers[0][1]
    if not all(schema.equals(first) for _, schema in footers):
        return None
    return footers


def _footer(path: str, opts: FileOptions) -> tuple[int, pa.Schema] | None:
    try:
        with opts.open_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            return parquet.metadata.num_rows, parquet.schema_arrow
    except (OSError, pa.ArrowException):
        return None
