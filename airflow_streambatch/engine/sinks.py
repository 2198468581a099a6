"""File sinks: one output file per task, named after the task, committed by rename.

The name ``part-<task key>.<ext>`` depends only on the task's inputs, so a task
that runs twice (a retry, a replay) writes the same file again instead of a second
copy; the temporary name keeps readers from ever seeing half a file.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

FILE_FORMATS = {"parquet": "parquet", "json": "jsonl", "csv": "csv"}


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path within it (local paths, ``s3://``, ``gs://``, ``hdfs://``)."""
    return pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), path)


def _write_json_lines(table: pa.Table, out) -> None:
    import json

    for row in table.to_pylist():
        out.write((json.dumps(row, default=str) + "\n").encode())


def write_task_output(tables: Iterator[pa.Table], path: str, file_format: str, env) -> tuple[str, int] | None:
    """Stream ``tables`` into ``<path>/part-<task_key>.<ext>``; return (file, rows), or None if empty."""
    fs, root = resolve(path)
    fs.create_dir(root, recursive=True)
    final = f"{root.rstrip('/')}/part-{env.task_key}.{FILE_FORMATS[file_format]}"
    tmp = f"{root.rstrip('/')}/.tmp-{env.task_key}-{uuid.uuid4().hex[:8]}"
    rows = 0
    writer = None
    try:
        with fs.open_output_stream(tmp) as out:
            for table in tables:
                if not table.num_rows:
                    continue
                rows += table.num_rows
                if file_format == "parquet":
                    writer = writer or pq.ParquetWriter(out, table.schema)
                    writer.write_table(table)
                elif file_format == "csv":
                    writer = writer or pacsv.CSVWriter(out, table.schema)
                    writer.write_table(table)
                else:
                    _write_json_lines(table, out)
            if writer is not None:
                writer.close()
    except BaseException:
        fs.delete_file(tmp)
        raise
    if rows == 0:
        fs.delete_file(tmp)
        return None
    fs.move(tmp, final)
    return (final if "://" not in path else f"{path.split('://')[0]}://{final}"), rows
