"""File sinks: sink tasks stage their files per task and partition; the driver commits.

A task of a write operator streams its rows into
``<path>/_staging/<run id>/p<partition>/part-<task key>[-<n>].<ext>`` (through temporary
names where a rename is cheap), and reports the files (path, rows, bytes) back to the driver. When every task
of a partition has finished, the driver commits the partition
(`output/commit.py`). Bundles never mix partitions, so a sink task always writes
for exactly one.

`SinkOptions` holds Ray Data's write arguments: rows per file, the pyarrow writer's
arguments, and the output stream's compression. They are checked in the driver, when
``write_*`` is called, so a bad one fails at once and names the argument instead of
failing every task.
"""

from __future__ import annotations

import errno
import json
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from airflow_streambatch.engine.errors import check_positive_int, is_disk_full
from airflow_streambatch.engine.filesystems import (
    COMPRESSION_SUFFIXES,
    OPEN_STREAM_ARGS,
    object_store_scheme,
    resolve_in,
)
from airflow_streambatch.engine.protocol.staging import StagedFile, schema_columns, staging_dir
from airflow_streambatch.engine.worker.tensors import column_to_numpy

FILE_FORMATS = {"parquet": "parquet", "json": "jsonl", "csv": "csv", "numpy": "npy"}
# the stream codecs pyarrow writes, and the extension this engine's readers infer each from
CODEC_EXTENSIONS = {codec: suffix[1:] for suffix, codec in COMPRESSION_SUFFIXES.items() if codec != "snappy"}
JSON_DEFAULTS = {"orient": "records", "lines": True}  # Ray's pandas to_json defaults: JSON Lines
# Ray Data's own write arguments that this engine does not take: refused by name, never passed on to
# pyarrow (ParquetWriter would take ``filesystem`` and ignore it for a stream)
RAY_ONLY_ARGS = ("partition_cols", "try_create_dir", "filename_provider", "arrow_parquet_args_fn",
                 "arrow_csv_args_fn", "pandas_json_args_fn", "ray_remote_args", "concurrency")


@dataclass
class SinkOptions:
    """Ray Data's per-write arguments, checked (`make`) before anything runs.

    :param min_rows_per_file: the sink's tasks bundle input blocks until they hold this
        many rows (within one partition, and within ``target_max_block_size``).
    :param max_rows_per_file: a task starts a new file once its file holds this many rows.
    :param format_args: keyword arguments of the pyarrow writer (``pq.ParquetWriter`` and
        ``row_group_size`` for Parquet, ``write_options`` for CSV); none for JSON.
    :param open_stream_args: ``compression`` and ``buffer_size`` of each file's output stream.
    :param filesystem: Ray Data's ``filesystem=``: the `pyarrow.fs.FileSystem` the output path is
        in (None: from the path's scheme); it travels to the sink tasks (pyarrow filesystems pickle).
    """

    min_rows_per_file: int | None = None
    max_rows_per_file: int | None = None
    format_args: dict = field(default_factory=dict)
    open_stream_args: dict = field(default_factory=dict)
    table: str = ""  # "delta" or "iceberg" when the files are a table's (named in messages)
    filesystem: pafs.FileSystem | None = None

    @classmethod
    def make(cls, file_format: str, *, min_rows_per_file=None, max_rows_per_file=None, num_rows_per_file=None,
             arrow_open_stream_args=None, format_args: dict | None = None, filesystem=None) -> SinkOptions:
        where = f"write_{file_format}"
        if filesystem is not None and not isinstance(filesystem, pafs.FileSystem):
            raise TypeError(f"{where}: filesystem must be a pyarrow.fs.FileSystem, got {type(filesystem).__name__} "
                            "(Ray also wraps fsspec filesystems; here a commit needs pyarrow's own rename or "
                            "object-store semantics, so wrap it yourself only if its rename is atomic)")
        ray_only = sorted(set(format_args or {}) & set(RAY_ONLY_ARGS))
        if ray_only:
            raise TypeError(f"{where}: Ray Data's {ray_only} not supported by this engine "
                            "(docs/ray-compatibility.md says what each write takes)")
        min_rows = _min_rows(where, min_rows_per_file, num_rows_per_file)
        check_positive_int(max_rows_per_file, f"{where}(max_rows_per_file=...)", allow_none=True)
        if min_rows is not None and max_rows_per_file is not None and min_rows > max_rows_per_file:
            raise ValueError(f"{where}: min_rows_per_file={min_rows} is greater than max_rows_per_file="
                             f"{max_rows_per_file}; lower min_rows_per_file or raise max_rows_per_file")
        stream = _check_open_stream_args(where, file_format, arrow_open_stream_args)
        checks = {"parquet": _check_parquet_args, "csv": _check_csv_args, "json": _check_json_args,
                  "numpy": _check_numpy_args}
        return cls(min_rows, max_rows_per_file, checks[file_format](dict(format_args or {})), stream,
                   filesystem=filesystem)

    def extension(self, file_format: str) -> str:
        """``csv``, or ``csv.gz`` with gzip: the readers infer the codec from the name."""
        codec = self.open_stream_args.get("compression")
        return FILE_FORMATS[file_format] + (f".{CODEC_EXTENSIONS[codec]}" if codec else "")


def _min_rows(where: str, min_rows_per_file, num_rows_per_file) -> int | None:
    """``num_rows_per_file`` is Ray's deprecated name of ``min_rows_per_file``."""
    if num_rows_per_file is not None:
        warnings.warn(f"{where}: num_rows_per_file is deprecated; use min_rows_per_file instead",
                      DeprecationWarning, stacklevel=4)
        if min_rows_per_file is not None:
            raise ValueError(f"{where}: give min_rows_per_file or num_rows_per_file (deprecated), not both")
        check_positive_int(num_rows_per_file, f"{where}(num_rows_per_file=...)")
        return num_rows_per_file
    check_positive_int(min_rows_per_file, f"{where}(min_rows_per_file=...)", allow_none=True)
    return min_rows_per_file


def _check_open_stream_args(where: str, file_format: str, args) -> dict:
    args = dict(args or {})
    unknown = sorted(set(args) - set(OPEN_STREAM_ARGS))
    if unknown:
        raise ValueError(f"{where}(arrow_open_stream_args=...): unsupported key(s) {unknown}; "
                         f"the supported keys are {list(OPEN_STREAM_ARGS)}")
    codec = args.get("compression")
    if codec is not None and file_format == "parquet":
        raise ValueError(f"{where}(arrow_open_stream_args={{'compression': {codec!r}}}): Parquet compresses inside "
                         f"the file; pass compression={codec!r} to write_parquet instead")
    if codec is not None and codec not in CODEC_EXTENSIONS:
        raise ValueError(f"{where}(arrow_open_stream_args={{'compression': {codec!r}}}): the compression must be "
                         f"one of {sorted(CODEC_EXTENSIONS)}")
    check_positive_int(args.get("buffer_size"), f"{where}(arrow_open_stream_args['buffer_size'])", allow_none=True)
    return args


def _check_parquet_args(args: dict) -> dict:
    """``row_group_size`` goes to each ``write_table`` call, the rest to ``pq.ParquetWriter``;
    a writer is opened on an in-memory buffer now, so an unknown argument or value fails here."""
    check_positive_int(args.get("row_group_size"), "write_parquet(row_group_size=...)", allow_none=True)
    writer_args = {k: v for k, v in args.items() if k != "row_group_size"}
    try:
        pq.ParquetWriter(pa.BufferOutputStream(), pa.schema([("x", pa.int64())]), **writer_args).close()
    except TypeError as exc:
        raise TypeError(f"write_parquet(**arrow_parquet_args): {sorted(writer_args)} are not all arguments of "
                        f"pyarrow.parquet.ParquetWriter (or row_group_size): {exc}") from exc
    except (ValueError, pa.ArrowException) as exc:
        raise ValueError(f"write_parquet(**arrow_parquet_args={writer_args}): pyarrow refused them: {exc}") from exc
    return args


def _check_csv_args(args: dict) -> dict:
    """Ray hands ``**arrow_csv_args`` to ``pyarrow.csv.write_csv``, whose only option is ``write_options``."""
    unknown = sorted(set(args) - {"write_options"})
    if unknown:
        raise TypeError(f"write_csv: unsupported argument(s) {unknown}; **arrow_csv_args takes only write_options "
                        "(a pyarrow.csv.WriteOptions), as pyarrow.csv.write_csv does")
    options = args.get("write_options")
    if options is None:
        return {}
    if not isinstance(options, pacsv.WriteOptions):
        raise TypeError(f"write_csv(write_options=...) must be a pyarrow.csv.WriteOptions, got "
                        f"{type(options).__name__}")
    options.validate()
    # pyarrow's WriteOptions does not pickle: the tasks get its settings and rebuild it
    settings = {name: getattr(options, name) for name in dir(options) if not name.startswith("_")}
    return {"write_options": {name: value for name, value in settings.items() if not callable(value)}}


def _check_json_args(args: dict) -> dict:
    """Ray passes ``**pandas_json_args`` to pandas ``to_json`` (default ``orient="records", lines=True``);
    this engine writes exactly that, JSON Lines, so only those values are accepted."""
    for key, value in args.items():
        if key not in JSON_DEFAULTS or value != JSON_DEFAULTS[key]:
            raise ValueError(f"write_json({key}={value!r}): only Ray's default JSON Lines output (orient='records', "
                             "lines=True) is written; other pandas to_json arguments are not supported")
    return {}


def _check_numpy_args(args: dict) -> dict:
    """``write_numpy`` takes the one column it writes, as Ray's does."""
    if set(args) != {"column"} or not isinstance(args["column"], str):
        raise TypeError(f"write_numpy: column= (the name of the one column to write) is required and no other "
                        f"writer argument is taken, got {args!r}")
    return args


class _StagedWriter:
    """One file being staged: a temporary name until the task has finished, or on object
    stores (no rename: a move is a copy) its staged name at once. The driver commits only
    the files tasks report, and an object appears whole when its upload completes, so a
    task that fails there leaves nothing a commit picks up either."""

    def __init__(self, fs, root: str, task_key: str, file_format: str, options: SinkOptions, schema: pa.Schema,
                 name: str | None = None):
        self.fs, self.root, self.task_key = fs, root, task_key
        self.file_format, self.options, self.schema = file_format, options, schema
        self.tmp = f"{root}/{name}" if name else f"{root}/.tmp-{task_key}-{uuid.uuid4().hex[:8]}"
        stream = options.open_stream_args
        self.out = fs.open_output_stream(self.tmp, compression=stream.get("compression"),
                                         buffer_size=stream.get("buffer_size"))
        self.rows = 0
        args = dict(options.format_args)
        self.row_group_size = args.pop("row_group_size", None)
        self.writer = None
        self.arrays: list[pa.ChunkedArray] = []  # a .npy file's column, saved whole when it closes
        if file_format == "parquet":
            self.writer = pq.ParquetWriter(self.out, schema, **args)
        elif file_format == "csv":
            options = pacsv.WriteOptions(**args["write_options"]) if "write_options" in args else None
            self.writer = pacsv.CSVWriter(self.out, schema, write_options=options)

    def room(self) -> int | None:
        limit = self.options.max_rows_per_file
        return None if limit is None else limit - self.rows

    def write(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        if self.file_format == "parquet":
            self.writer.write_table(table, row_group_size=self.row_group_size)
        elif self.file_format == "csv":
            self.writer.write_table(table)
        elif self.file_format == "numpy":
            column = self.options.format_args["column"]
            if column not in table.column_names:
                raise KeyError(f"write_numpy(column={column!r}): no such column; the columns are {table.column_names}")
            self.arrays.append(table.column(column))
        else:
            for row in table.to_pylist():
                self.out.write((json.dumps(row, default=str) + "\n").encode())

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.arrays:  # NumPy's format states the row count in its header: one save of the whole column
            chunks = [chunk for array in self.arrays for chunk in array.chunks]
            np.save(self.out, column_to_numpy(pa.chunked_array(chunks)), allow_pickle=False)
        self.out.close()

    def discard(self) -> None:
        try:
            if not self.out.closed:
                self.out.close()
        finally:
            self.fs.delete_file(self.tmp)

    def publish(self, name: str) -> StagedFile:
        final = f"{self.root}/{name}"
        if final != self.tmp:
            self.fs.move(self.tmp, final)
        return StagedFile(final, self.rows, self.fs.get_file_info(final).size, schema_columns(self.schema))


def _same_schema(tables: Iterator[pa.Table], partition: int) -> Iterator[pa.Table]:
    """The non-empty tables, refusing a change of schema within the partition."""
    schema = None
    for table in tables:
        if not table.num_rows:
            continue
        if schema is None:
            schema = table.schema
        elif not table.schema.equals(schema):
            raise TypeError(f"batch schema changed within partition {partition}: {schema} then {table.schema}")
        yield table


def _fill(files: list[_StagedWriter], table: pa.Table, new_file) -> None:
    """Write ``table`` into the last file, starting a new one each time a file reaches max_rows_per_file."""
    while table.num_rows:
        if not files or files[-1].room() == 0:
            if files:
                files[-1].close()
            files.append(new_file(table.schema))
        room = files[-1].room()
        part = table if room is None else table.slice(0, room)
        files[-1].write(part)
        table = table.slice(part.num_rows)


def write_task_output(tables: Iterator[pa.Table], path: str, file_format: str, env,
                      options: SinkOptions | None = None, staged: bool = True) -> None:
    """Stream ``tables`` into this task's files; record them in ``env.written``.

    ``staged``: the files go to the partition's staging directory, which the commit
    makes visible; otherwise (a table's data files, visible only once a table commit
    lists them) straight into ``path``, named by run and task so that no two runs or
    tasks collide. Files stay under temporary names until the task has written them
    all where a rename is cheap: a task that fails leaves nothing a commit would pick
    up, and a retry (same task key) writes the same names again.
    """
    options = options or SinkOptions()
    (partition,) = env.partitions
    fs, root = resolve_in(path.rstrip("/"), options.filesystem)
    if staged:
        root = staging_dir(root, env.run_id, partition)  # staging does not depend on the write's tag
    on_store = object_store_scheme(fs) is not None
    if not on_store:  # an object store has no directories: creating one costs 6 requests for markers
        fs.create_dir(root, recursive=True)
    ext = options.extension(file_format)
    stem = f"part-{env.task_key}" if staged else f"part-{env.run_id}-{env.task_key}"
    files: list[_StagedWriter] = []

    def new_file(schema: pa.Schema) -> _StagedWriter:
        name = f"{stem}-{len(files):05d}.{ext}" if on_store else None
        return _StagedWriter(fs, root, env.task_key, file_format, options, schema, name)

    try:
        for table in _same_schema(tables, partition):
            _fill(files, table, new_file)
        if files:
            files[-1].close()
    except BaseException as exc:
        for file in files:
            file.discard()
        if is_disk_full(exc):  # say which file: the driver tells a full output disk from a full block dir
            raise OSError(errno.ENOSPC, "No space left on device", files[-1].tmp if files else root) from exc
        raise
    if on_store:  # named when opened; the commit copies only the files reported
        env.written.extend(file.publish(file.tmp.rsplit("/", 1)[-1]) for file in files)
        return
    names = [f"{stem}.{ext}" if len(files) == 1 and staged else f"{stem}-{n:05d}.{ext}" for n in range(len(files))]
    if staged:
        _remove_earlier_attempts(fs, root, env.task_key, names)
    for name, file in zip(names, files):
        env.written.append(file.publish(name))


def _remove_earlier_attempts(fs, root: str, task_key: str, names: list[str]) -> None:
    """Files an earlier attempt of this task published under names this one does not write
    (it died between renames, and this attempt cut its rows into fewer files): the
    partition's commit renames the whole directory, so they would be committed with it."""
    for info in fs.get_file_info(pafs.FileSelector(root)):
        if info.base_name.startswith(f"part-{task_key}") and info.base_name not in names:
            fs.delete_file(info.path)
