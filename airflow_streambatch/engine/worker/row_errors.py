"""The per-row error policy, on executors: rows that make a user function fail are set aside.

``on_error="fail"`` (the default) fails the task, and after its retries the input
partition, as before. ``on_error="quarantine"`` keeps the good rows flowing and
sets aside each row the function fails on, with the error's text, the operator and
the input partition it came from:

* a row function (``map``, ``flat_map``, ``filter``) is called row by row anyway, so
  a failing row is known at once;
* a batch function (``map_batches``) fails for a whole batch; the batch is halved and
  each half called again, down to the single rows that fail (k bad rows of n cost
  about ``k * log2(n)`` extra calls, and a batch without a bad row costs nothing).
  Whatever a failing call yielded before it raised is dropped, then made again by
  the halves.

The rows set aside are written once the task has succeeded, as one Parquet file
(``_quarantine-<task key>.parquet``) in the staging directory of the task's input
partition under the write's path. The partition's commit lists it beside its data
files (`output/commit.py`), so it becomes visible with them, exactly once: a failed
attempt writes nothing, and a retry or a replay writes the same name again. Its
``_`` prefix keeps it out of every reader of the output.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_streambatch.engine.context import ROW_ERROR_POLICIES
from airflow_streambatch.engine.filesystems import object_store_scheme, resolve
from airflow_streambatch.engine.protocol.staging import StagedFile, schema_columns, staging_dir

QUARANTINE_PREFIX = "_quarantine-"
ERROR_CHARS = 2000  # head of each error's text in the file
QUARANTINE_SCHEMA = pa.schema([
    ("partition", pa.int64()),  # the input partition's index (the commit record's partition)
    ("input", pa.string()),  # the input partition's label: the file (or file range) the row was read from
    ("operator", pa.string()),  # the operator whose function failed on the row
    ("error", pa.string()),  # the exception's type and message
    ("row", pa.string()),  # the row as the function received it, as JSON
])


def check_policy(on_error: str | None, where: str) -> None:
    if on_error is not None and on_error not in ROW_ERROR_POLICIES:
        raise ValueError(f"{where}: on_error must be one of {ROW_ERROR_POLICIES}, got {on_error!r}")


def _json_value(value):
    return value.tolist() if hasattr(value, "tolist") else repr(value)


def set_aside(env, transform, row: dict, exc: BaseException) -> None:
    """Keep ``row``, which ``transform``'s function failed on, for the task's quarantine file."""
    (partition,) = env.partitions  # a quarantining write never mixes partitions in a task (`plan/row_errors.py`)
    env.dead_letter = transform.dead_letter
    env.set_aside.append({
        "partition": partition, "input": env.input_label, "operator": transform.name,
        "error": f"{type(exc).__name__}: {exc}"[:ERROR_CHARS], "row": json.dumps(row, default=_json_value),
    })


def guarded(call: Callable[[pa.Table], list[pa.Table]], batch: pa.Table, transform, env) -> list[pa.Table]:
    """``call(batch)``; where it raises, the same over each half, down to single rows, which are set aside."""
    try:
        return call(batch)
    except Exception as exc:  # noqa: BLE001 - user code: any exception marks rows to find
        if batch.num_rows <= 1:
            for row in batch.to_pylist():
                set_aside(env, transform, row, exc)
            return []
    half = batch.num_rows // 2
    return guarded(call, batch.slice(0, half), transform, env) + guarded(call, batch.slice(half), transform, env)


def write_set_aside(env) -> list[StagedFile]:
    """The task's rows set aside, as one file staged for its partition's commit (none if none)."""
    if not env.set_aside:
        return []
    table = pa.Table.from_pylist(env.set_aside, schema=QUARANTINE_SCHEMA)
    fs, root = resolve(env.dead_letter.rstrip("/"))
    directory = staging_dir(root, env.run_id, env.partitions[0])
    name = f"{QUARANTINE_PREFIX}{env.task_key}.parquet"
    if object_store_scheme(fs) is not None:  # an object appears whole once its upload completes
        with fs.open_output_stream(f"{directory}/{name}") as out:
            pq.write_table(table, out)
    else:  # under a temporary name, then renamed: a commit never lists a half-written file
        fs.create_dir(directory, recursive=True)
        with fs.open_output_stream(f"{directory}/.{name}.tmp") as out:
            pq.write_table(table, out)
        fs.move(f"{directory}/.{name}.tmp", f"{directory}/{name}")
    size = fs.get_file_info(f"{directory}/{name}").size or 0
    return [StagedFile(f"{directory}/{name}", table.num_rows, size, schema_columns(QUARANTINE_SCHEMA))]
