"""File sinks: sink tasks stage one file per task and partition; the driver commits.

A task of a write operator streams its rows into
``<path>/_staging/<run id>/p<partition>/part-<task key>.<ext>`` through a temporary
name, and reports the file (path, rows, bytes) back to the driver. When every task
of an input partition has finished, the driver commits the partition
(`execution/commit.py`). Bundles never mix input partitions, so a sink task
always writes for exactly one.
"""

from __future__ import annotations

import errno
import json
import uuid
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from airflow_streambatch.engine.errors import is_disk_full
from airflow_streambatch.engine.filesystems import resolve
from airflow_streambatch.engine.worker.staging import StagedFile, schema_columns, staging_dir

FILE_FORMATS = {"parquet": "parquet", "json": "jsonl", "csv": "csv"}


def _write_json_lines(table: pa.Table, out) -> None:
    for row in table.to_pylist():
        out.write((json.dumps(row, default=str) + "\n").encode())


def write_task_output(tables: Iterator[pa.Table], path: str, file_format: str, env) -> None:
    """Stream ``tables`` into this task's staged file; record it in ``env.written``."""
    (partition,) = env.partitions
    fs, root = resolve(path.rstrip("/"))
    root = staging_dir(root, env.run_id, partition)  # staging does not depend on the write's tag
    fs.create_dir(root, recursive=True)
    final = f"{root}/part-{env.task_key}.{FILE_FORMATS[file_format]}"
    tmp = f"{root}/.tmp-{env.task_key}-{uuid.uuid4().hex[:8]}"
    rows = 0
    writer = None
    schema = None
    try:
        with fs.open_output_stream(tmp) as out:
            for table in tables:
                if not table.num_rows:
                    continue
                if schema is None:
                    schema = table.schema
                elif not table.schema.equals(schema):
                    raise TypeError(f"batch schema changed within partition {partition}: {schema} then {table.schema}")
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
    except BaseException as exc:
        fs.delete_file(tmp)
        if is_disk_full(exc):  # say which file: the driver tells a full output disk from a full block dir
            raise OSError(errno.ENOSPC, "No space left on device", final) from exc
        raise
    if rows == 0:
        fs.delete_file(tmp)
        return
    fs.move(tmp, final)
    env.written.append(StagedFile(final, rows, fs.get_file_info(final).size, schema_columns(schema)))
