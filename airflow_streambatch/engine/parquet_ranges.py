"""Parquet files cut along row groups: `read_parquet`'s fragments, and the epoch manifest's
row-group ranges (``epochs/manifest.py``), both found from the file's footer alone; and
`read_row_groups`, which reads one such fragment with its columns and filter pushed into
pyarrow's scan."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from airflow_streambatch.engine.filesystems import resolve, resolve_in
from airflow_streambatch.engine.plan.datasource import READ_BATCH_ROWS, Fragment
from airflow_streambatch.engine.read_formats import schema_drift
from airflow_streambatch.engine.read_options import FileOptions
from airflow_streambatch.engine.read_pruning import bind_filter, check_selected

_PARQUET = pads.ParquetFileFormat()


def row_groups_in(opts: FileOptions):
    """How `read_parquet` splits a file it lists: one fragment per row group."""
    def split(path: str, size: int) -> list[Fragment]:
        try:
            with opts.open_file(path) as handle:
                meta = pq.ParquetFile(handle).metadata
        except (OSError, pa.ArrowException):
            return [Fragment(path, size)]  # unreadable: its read task fails and names it
        if meta.num_row_groups <= 1:
            return [Fragment(path, size)]
        return [Fragment(path, meta.row_group(i).total_byte_size, (i,)) for i in range(meta.num_row_groups)]

    return split


def parquet_row_group_ranges(path: str, max_bytes: int) -> list[tuple[int, int, int]] | None:
    """``(start, stop, bytes)`` row-group ranges of at most ``max_bytes`` each (compressed, as stored),
    contiguous and covering the file; None when the file is not one readable Parquet file or
    fits in one range. Reads the footer only (one small read at the file's end), so listing
    the partitions of a 10 GiB file costs what a stat does. Row groups are packed in order
    while they fit, as Spark packs files into ``maxPartitionBytes``; a row group is never
    cut, so one larger than ``max_bytes`` is a range of its own.
    """
    try:
        fs, inner = resolve(path)
        with fs.open_input_file(inner) as handle:
            meta = pq.ParquetFile(handle).metadata
    except (OSError, pa.ArrowException):
        return None  # not Parquet (or unreadable): the whole file stays one partition, and its read names it
    sizes = [sum(meta.row_group(i).column(c).total_compressed_size for c in range(meta.num_columns))
             for i in range(meta.num_row_groups)]
    ranges: list[tuple[int, int, int]] = []
    start, acc = 0, 0
    for i, size in enumerate(sizes):
        if i > start and acc + size > max_bytes:
            ranges.append((start, i, acc))
            start, acc = i, 0
        acc += size
    ranges.append((start, len(sizes), acc))
    return ranges if len(ranges) > 1 else None


def read_row_groups(fragment: Fragment, opts: FileOptions, expected: pa.Schema | None, reference: str,
                    columns: list[str] | None = None, row_filter: pc.Expression | None = None,
                    where: str = "read_parquet", batch_size: int = READ_BATCH_ROWS) -> Iterator[pa.Table]:
    """One fragment's rows (its row groups, or the whole file), pruned inside pyarrow's Parquet scan.

    Only the columns named in ``columns`` or the filter are fetched and decoded; row groups
    whose min/max statistics exclude the filter are not fetched at all (a range of row
    groups is narrowed the same way), and the filter drops the remaining rows that fail it.
    Partition values and, with ``include_paths``, the path are constants of the fragment
    that the scan fills in, so ``columns`` and the filter can name them. A file whose schema
    differs from ``reference``'s fails, naming both (``expected=None``: each file keeps its own schema,
    ``read_parquet_bulk``); tables are about ``READ_BATCH_ROWS``, decoded ``batch_size`` rows at a time
    (Ray's ``batch_size=``).
    """
    fs, inner = resolve_in(fragment.path, opts.filesystem)
    if expected is None:
        expected = _PARQUET.make_fragment(inner, fs).physical_schema
    constants = opts.constant_columns(fragment.path, expected.names)
    schema = scan_schema(expected, constants)
    known = pc.scalar(True)
    for f, value in constants:
        known = known & (pc.field(f.name) == value)
    piece = _PARQUET.make_fragment(inner, fs, partition_expression=known)  # one footer read, kept by subset()
    found = piece.physical_schema
    if not found.equals(expected):
        raise ValueError(f"schema drift: {schema_drift(expected, found)} (compared with {reference})")
    if fragment.row_groups is not None:
        groups = list(fragment.row_groups)
        if groups and groups[-1] >= piece.num_row_groups:
            raise ValueError(f"row group {groups[-1]} asked for, but the file has only {piece.num_row_groups} "
                             "(it was rewritten after it was partitioned)")
        piece = piece.subset(row_group_ids=groups)
    wanted = wanted_columns(columns, opts)
    check_selected(wanted, schema.names, where, fragment.path)
    if row_filter is not None:
        bind_filter(row_filter, schema, where, fragment.path)
        piece = piece.subset(filter=row_filter, schema=schema)  # the row groups its statistics may match
    # one batch read ahead, not pyarrow's 16: what a task holds stays within what the scheduler granted it
    batches = piece.to_batches(schema=schema, columns=wanted, filter=row_filter, batch_size=batch_size,
                               batch_readahead=1, fragment_readahead=1)
    pending, rows = [], 0
    for batch in batches:
        if batch.num_rows:
            pending.append(batch)
            rows += batch.num_rows
        if rows >= READ_BATCH_ROWS:
            yield pa.Table.from_batches(pending)
            pending, rows = [], 0
    if pending:
        yield pa.Table.from_batches(pending)


def scan_schema(file_schema: pa.Schema, constants: list) -> pa.Schema:
    """What the scan of one file gives before ``columns``: its columns, then the constants
    `FileOptions.constant_columns` adds (partition values, the path)."""
    return pa.schema([*file_schema, *(f for f, _ in constants)])


def wanted_columns(columns: list[str] | None, opts: FileOptions) -> list[str] | None:
    """The scan's projection: ``columns`` (None: all), with ``path`` after them under ``include_paths``."""
    return None if columns is None else list(dict.fromkeys([*columns, *(["path"] if opts.include_paths else [])]))


def read_schema(file_schema: pa.Schema, path: str, opts: FileOptions, columns: list[str] | None) -> pa.Schema | None:
    """The schema `read_row_groups` gives a file of ``file_schema`` at ``path``, known from its footer
    alone (``repr`` of a Parquet read); None where ``columns`` names a column the scan lacks (the read
    fails naming it)."""
    full = scan_schema(file_schema, opts.constant_columns(path, file_schema.names))
    wanted = wanted_columns(columns, opts)
    if wanted is None:
        return full
    if any(name not in full.names for name in wanted):
        return None
    return pa.schema([full.field(name) for name in wanted])
