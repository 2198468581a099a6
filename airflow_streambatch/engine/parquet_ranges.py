"""Parquet files cut along row groups: `read_parquet`'s fragments, and the epoch manifest's
row-group ranges (``epochs/manifest.py``). Both read only the file's footer."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_streambatch.engine.filesystems import resolve
from airflow_streambatch.engine.plan.datasource import Fragment
from airflow_streambatch.engine.read_options import FileOptions


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
