"""Dataset constructors with Ray Data's names: ``read_*``, ``from_items``, ``range``.

Paths go through ``pyarrow.fs``: local paths, ``s3://``, ``gs://`` and ``hdfs://``.
Nothing is read here; listing and partitioning happen when a consumer runs.
"""

from __future__ import annotations

import builtins
import dataclasses
import re

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from airflow_streambatch.engine.dataset import Dataset
from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.parquet_meta import parquet_meta_rows, parquet_meta_schema
from airflow_streambatch.engine.metadata_providers import check_meta_provider, provider_listing
from airflow_streambatch.engine.plan.datasource import (
    READ_BATCH_ROWS,
    Datasource,
    Fragment,
    expand_paths,
    file_datasource,
    fragment_label,
    fragments_datasource,
    items_datasource,
    range_datasource,
)
from airflow_streambatch.engine.plan.logical import Read
from airflow_streambatch.engine.worker.line_ranges import first_line, read_line_range
from airflow_streambatch.engine.read_formats import (
    cast_null_columns,
    check_csv_args,
    check_json_args,
    csv_compatible,
    csv_range_args,
    first_readable,
    json_table,
    open_csv_file,
    schema_drift,
)
from airflow_streambatch.engine.parquet_args import applied, block_fn, check_parquet_args
from airflow_streambatch.engine.parquet_ranges import read_row_groups, row_groups_in
from airflow_streambatch.engine.path_args import FileOrder, check_shuffle, normalize_path, normalize_paths
from airflow_streambatch.engine.read_pruning import bind_filter, check_columns, check_filter, prune_source
from airflow_streambatch.engine.num_blocks_alias import with_parallelism
from airflow_streambatch.engine.read_resources import with_read_resources
from airflow_streambatch.engine.read_options import HIVE, TEXT_DEFAULTS, FileOptions, file_options


def _check_blocks(override_num_blocks, where: str, meta_provider=None) -> None:
    """``override_num_blocks``, and Ray's ``meta_provider`` (its type; `provider_paths` calls it)."""
    check_positive_int(override_num_blocks, f"{where}: override_num_blocks", allow_none=True)
    check_meta_provider(meta_provider, where)


def provider_paths(meta_provider, paths: list[str], opts: FileOptions) -> list[str]:
    """The paths a file read reads: with a ``meta_provider``, what its ``expand_paths`` lists now,
    as Ray lists at the ``read_*`` call (`metadata_providers.provider_listing`)."""
    return provider_listing(meta_provider, paths, opts.filesystem, opts.partitioning, opts.ignore_missing_paths)


def _file_source(source: Datasource, paths) -> Datasource:
    """The source, remembering its input paths: a write must not land inside them (`check_disjoint`)."""
    return dataclasses.replace(source, paths=(paths,) if isinstance(paths, str) else tuple(paths))


def _files(name: str, paths, reader, opts: FileOptions, override_num_blocks, shuffle=None) -> Dataset:
    if shuffle is None:
        source = file_datasource(name, paths, (), reader, listing=opts.listing())
        return Dataset([Read(_file_source(source, paths), override_num_blocks)])
    order = FileOrder(check_shuffle(shuffle, opts.where))

    def plan(slots: int, override: int | None, target_bytes: int):  # listed, then ordered anew each execution
        files = order([path for path, _ in expand_paths(paths, **opts.listing())])
        return file_datasource(name, files, (), reader, listing=opts.listing()).plan(slots, override, target_bytes)

    return Dataset([Read(_file_source(Datasource(name, plan), paths), override_num_blocks)])


@with_read_resources
def read_parquet(paths, *, filesystem=None, columns: list[str] | None = None, filter=None,  # noqa: A002 - Ray's name
                 partitioning=HIVE, include_paths: bool = False, file_extensions: list[str] | None = None,
                 partition_filter=None, shuffle=None, override_num_blocks: int | None = None,
                 meta_provider=None, tensor_column_schema: dict | None = None, **arrow_parquet_args) -> Dataset:
    """Parquet files (a file, a directory, or a list); split by row groups when files are few.

    Every file must have the schema of the first one (checked as it is read): a file
    whose columns or types drifted fails its partition with an error naming both files.
    Hive ``key=value`` directories add string columns by default, as in Ray (a column
    the file has keeps the file's values); ``file_extensions`` filters every file.
    ``columns`` and ``filter`` (a `pyarrow.compute.Expression` or pyarrow's DNF list, as
    Ray passes it on) go into pyarrow's Parquet scan: other columns are not decoded and
    row groups whose statistics exclude the filter are skipped (`read_pruning`).
    ``shuffle``: ``"files"`` or a `FileShuffleConfig` orders the files anew on each execution.
    ``tensor_column_schema``, ``batch_size`` and ``_block_udf``: Ray's (`parquet_args.py`).
    """
    _check_blocks(override_num_blocks, "read_parquet", meta_provider)
    paths, order = normalize_paths(paths, "read_parquet"), FileOrder(check_shuffle(shuffle, "read_parquet"))
    opts = file_options("read_parquet", filesystem=filesystem, partitioning=partitioning,
                        include_paths=include_paths, file_extensions=file_extensions, partition_filter=partition_filter)
    columns, row_filter = check_columns(columns, "read_parquet"), check_filter(filter, "read_parquet")
    batch_size, block_udf = check_parquet_args(arrow_parquet_args, "read_parquet")
    per_table = block_fn(tensor_column_schema, block_udf, "read_parquet")
    suffixes = (".parquet", ".parq")

    def plan(slots: int, override: int | None, target_bytes: int):
        listed = order([path for path, _ in expand_paths(paths, suffixes, **opts.listing())])
        reader = applied(_parquet_reader(listed, columns, opts, row_filter, batch_size), per_table)
        return file_datasource("Parquet", listed, suffixes, reader, row_groups_in(opts),
                               listing=opts.listing()).plan(slots, override, target_bytes)

    # what the footers tell without a run: count()'s rows and repr's schema (`parquet_meta.py`), unless
    # a function changes the tables (tensor columns: the schema; a _block_udf: the rows too)
    source = Datasource("Parquet", plan,
                        meta_rows=None if block_udf else parquet_meta_rows(paths, suffixes, opts, row_filter),
                        meta_schema=None if per_table else parquet_meta_schema(paths, suffixes, opts, columns))
    return Dataset([Read(_file_source(source, paths), override_num_blocks)])


def read_fragments(fragments: list[Fragment], input_format: str = "parquet", *, columns: list[str] | None = None,
                   filter=None) -> Dataset:  # noqa: A002 - read_parquet's name
    """Partitions decided beforehand: one read task per `Fragment`, in the given order.

    For inputs whose partitioning is frozen elsewhere, such as an epoch manifest that
    split a large file into Parquet row-group ranges or line-aligned byte ranges:
    partition ``i`` reads ``fragments[i]`` on every try, so its commit record stays
    valid. Schemas are checked against the first readable file, as the ``read_*``
    functions do, and each format's ``read_*`` defaults apply (Hive partition columns
    for Parquet, CSV and JSON; compression from the file name). Row groups need
    ``parquet``; byte ranges need a line-based format and an uncompressed file.
    ``columns`` and ``filter`` are `read_parquet`'s: pushed into the scan of a Parquet
    fragment (a row-group range reads only its row groups the filter may match); for
    the other formats applied to what each read task parses, in the task.
    """
    fragments = list(fragments)
    if fragments and all(isinstance(f, Fragment) for f in fragments):
        fragments = [dataclasses.replace(f, path=normalize_path(f.path, "read_fragments")) for f in fragments]
    if not fragments or not all(isinstance(f, Fragment) for f in fragments):
        raise ValueError("read_fragments: fragments must be a non-empty list of "
                         "airflow_streambatch.engine.plan.datasource.Fragment")
    if input_format not in _FRAGMENT_READERS:
        raise ValueError(f"read_fragments: input_format={input_format!r} is not one of {sorted(_FRAGMENT_READERS)}")
    for fragment in fragments:
        if fragment.row_groups is not None and input_format != "parquet":
            raise ValueError(f"{fragment_label(fragment)} is a Parquet row-group range, but input_format="
                             f"{input_format!r}")
        if fragment.byte_range is not None and input_format not in LINE_FORMATS:
            raise ValueError(f"{fragment_label(fragment)} is a byte range of lines, but input_format="
                             f"{input_format!r} is not one of {sorted(LINE_FORMATS)}")
    columns, row_filter = check_columns(columns, "read_fragments"), check_filter(filter, "read_fragments")
    files = list(dict.fromkeys(f.path for f in fragments))
    name = input_format.capitalize()

    def plan(slots: int, override: int | None, target_bytes: int):
        if input_format == "parquet":
            reader = _parquet_reader(files, columns, file_options("read_fragments", partitioning=HIVE), row_filter)
            return fragments_datasource(name, fragments, reader).plan(slots, override, target_bytes)
        source = fragments_datasource(name, fragments, _FRAGMENT_READERS[input_format](files))
        return prune_source(source, columns, row_filter, "read_fragments").plan(slots, override, target_bytes)

    return Dataset([Read(_file_source(Datasource(name, plan), files), None)])


def _parquet_reader(files: list[str], columns: list[str] | None, opts: FileOptions, row_filter=None,
                    batch_size: int = READ_BATCH_ROWS):
    """Reads one fragment's row groups (all when None), pruned by ``columns`` and ``row_filter``
    (`parquet_ranges.read_row_groups`); a file whose schema differs from the first readable
    file's fails its own partition, naming both files. A filter that does not fit the first
    file fails here, in the driver, before any task runs."""
    reference, expected = first_readable(files, lambda handle: pq.ParquetFile(handle).schema_arrow, "parquet",
                                          opts.open_file)
    if row_filter is not None:
        constants = opts.constant_columns(reference, expected.names)
        bind_filter(row_filter, pa.schema([*expected, *(f for f, _ in constants)]), opts.where, reference)

    def reader(fragment: Fragment):
        return read_row_groups(fragment, opts, expected, reference, columns, row_filter, opts.where, batch_size)

    return reader


@with_read_resources
def read_csv(paths, *, filesystem=None, arrow_open_stream_args: dict | None = None, partitioning=HIVE,
             include_paths: bool = False, ignore_missing_paths: bool = False,
             file_extensions: list[str] | None = None, override_num_blocks: int | None = None,
             meta_provider=None, partition_filter=None,
             parse_options: pacsv.ParseOptions | None = None, read_options: pacsv.ReadOptions | None = None,
             convert_options: pacsv.ConvertOptions | None = None, shuffle=None) -> Dataset:
    """CSV files with a header row; types are inferred by Arrow, or set with ``convert_options``.

    ``parse_options``, ``read_options`` and ``convert_options`` are pyarrow's, as Ray's
    ``**arrow_csv_args`` pass them. Each file's types are inferred on their own, so
    every file must come out with the types of the first one: a column whose type
    differs (ints in one file, text in another) fails that file's partition with an
    error naming both files, the column and both types. A column that is empty in a
    file (type null) takes the first file's type.
    """
    _check_blocks(override_num_blocks, "read_csv", meta_provider)
    paths, order = normalize_paths(paths, "read_csv"), FileOrder(check_shuffle(shuffle, "read_csv"))
    opts = file_options("read_csv", filesystem=filesystem, partitioning=partitioning, include_paths=include_paths,
                        ignore_missing_paths=ignore_missing_paths, file_extensions=file_extensions,
                        arrow_open_stream_args=arrow_open_stream_args, partition_filter=partition_filter)
    csv_args = check_csv_args(parse_options, read_options, convert_options)
    paths = provider_paths(meta_provider, paths, opts)

    def plan(slots: int, override: int | None, target_bytes: int):
        files = order([path for path, _ in expand_paths(paths, **opts.listing())])
        source = file_datasource("CSV", files, (), _csv_reader(files, csv_args, opts), listing=opts.listing())
        return source.plan(slots, override, target_bytes)

    return Dataset([Read(_file_source(Datasource("CSV", plan), paths), override_num_blocks)])


def _csv_reader(files: list[str], csv_args: dict, opts: FileOptions):
    """Reads one fragment of CSV; a byte range is parsed under its file's header line, with the
    first file's column types so that every range of a file types its columns alike."""
    reference, expected = first_readable(files, lambda handle: pacsv.open_csv(handle, **csv_args).schema, "CSV",
                                          opts.open_stream)
    range_args = csv_range_args(csv_args, expected)

    def reader(fragment: Fragment):
        args = csv_args
        if fragment.byte_range is None:
            handle = opts.open_stream(fragment.path)
        else:
            opts.check_splittable(fragment.path)
            if range_args["header"] is None:
                raise ValueError("read_options skips rows at the file's start, so it cannot be read in byte ranges")
            with opts.open_file(fragment.path) as handle:
                lines = read_line_range(handle, *fragment.byte_range)
                header = first_line(handle) if fragment.byte_range[0] > 0 and range_args["header"] else b""
            handle, args = pa.BufferReader(header + lines), range_args["args"]
        with handle:
            stream = open_csv_file(handle, args, fragment.path)
            found = stream.schema
            if not csv_compatible(expected, found):
                raise ValueError(f"CSV column types differ from the first file's: {schema_drift(expected, found)}"
                                 f" (compared with {reference}); make the files agree or set the column types "
                                 "with read_csv(..., convert_options=pyarrow.csv.ConvertOptions(column_types=...))")
            for batch in _csv_batches(stream):
                yield opts.finish(cast_null_columns(pa.Table.from_batches([batch]), expected), fragment.path)

    return reader


def _csv_batches(stream):
    """The stream's batches; a value that does not fit the column's type names the column, not just its number."""
    while True:
        try:
            batch = stream.read_next_batch()
        except StopIteration:
            return
        except pa.ArrowInvalid as exc:
            found = re.search(r"column #(\d+)", str(exc))
            if found and int(found.group(1)) < len(stream.schema):
                field = stream.schema.field(int(found.group(1)))
                raise ValueError(f"column {field.name!r} (typed {field.type} from the file's first rows): {exc}; set "
                                 "its type with read_csv(..., convert_options=pyarrow.csv.ConvertOptions("
                                 "column_types=...))") from exc
            raise
        yield batch


@with_read_resources
def read_json(paths, *, lines: bool = False, filesystem=None, arrow_open_stream_args: dict | None = None,
              partitioning=HIVE, include_paths: bool = False, ignore_missing_paths: bool = False,
              file_extensions: list[str] | None = None, override_num_blocks: int | None = None,
              meta_provider=None, partition_filter=None,
              shuffle=None, **arrow_json_args) -> Dataset:
    """JSON files: by default (``lines=False``) a file of JSON Lines (one object per line), a JSON
    array of objects, or one object (one row), as Ray reads them; ``lines=True``: every
    line is one object (a row), and a file that is not JSON Lines fails naming it.
    ``arrow_json_args``: ``read_options`` (`pyarrow.json.ReadOptions`) and ``parse_options``
    (`pyarrow.json.ParseOptions`, e.g. ``explicit_schema``), as Ray passes them to Arrow."""
    _check_blocks(override_num_blocks, "read_json", meta_provider)
    paths = normalize_paths(paths, "read_json")
    if not isinstance(lines, bool):
        raise TypeError(f"read_json: lines must be True or False, got {lines!r}")
    opts = file_options("read_json", filesystem=filesystem, partitioning=partitioning, include_paths=include_paths,
                        ignore_missing_paths=ignore_missing_paths, file_extensions=file_extensions,
                        arrow_open_stream_args=arrow_open_stream_args, partition_filter=partition_filter)
    paths = provider_paths(meta_provider, paths, opts)
    return _files("JSON", paths, _json_reader(lines, opts, check_json_args(arrow_json_args)), opts, override_num_blocks,
                  shuffle)


def _json_reader(lines: bool, opts: FileOptions, json_args: dict | None = None):
    def reader(fragment: Fragment):
        if fragment.byte_range is None:
            with opts.open_stream(fragment.path) as handle:
                data = handle.read()
        else:
            opts.check_splittable(fragment.path)
            with opts.open_file(fragment.path) as handle:
                data = read_line_range(handle, *fragment.byte_range)
        if data.strip():  # a range inside one long line holds no line of its own
            yield opts.finish(json_table(data, lines, fragment.byte_range is None, json_args), fragment.path)

    return reader


@with_read_resources
def read_text(paths, *, encoding: str = "utf-8", drop_empty_lines: bool = True, filesystem=None,
              arrow_open_stream_args: dict | None = None, partitioning=None, include_paths: bool = False,
              ignore_missing_paths: bool = False, file_extensions: list[str] | None = None,
              partition_filter=None, override_num_blocks: int | None = None,
              meta_provider=None, shuffle=None) -> Dataset:
    """One row per line, in a ``text`` column, as Ray Data reads text: lines are cut at ``\n`` only
    (a ``\r`` before it stays), and lines that are empty or blank are dropped unless
    ``drop_empty_lines=False``, which keeps them, and the empty line after a final ``\n``."""
    _check_blocks(override_num_blocks, "read_text", meta_provider)
    paths = normalize_paths(paths, "read_text")
    opts = file_options("read_text", filesystem=filesystem, partitioning=partitioning, include_paths=include_paths,
                        ignore_missing_paths=ignore_missing_paths, file_extensions=file_extensions,
                        arrow_open_stream_args=arrow_open_stream_args, partition_filter=partition_filter)
    paths = provider_paths(meta_provider, paths, opts)
    return _files("Text", paths, _text_reader(encoding, drop_empty_lines, opts), opts, override_num_blocks, shuffle)


def _text_reader(encoding: str, drop_empty_lines: bool, opts: FileOptions = TEXT_DEFAULTS):
    def reader(fragment: Fragment):
        if fragment.byte_range is None:
            with opts.open_stream(fragment.path) as handle:
                lines = handle.read().decode(encoding).split("\n")
        elif "\n".encode(encoding) == b"\n":
            opts.check_splittable(fragment.path)
            with opts.open_file(fragment.path) as handle:
                data = read_line_range(handle, *fragment.byte_range)
                lines = data.decode(encoding).split("\n") if data else []
                if data and handle.tell() < handle.size():
                    lines.pop()  # the "" after its last \n: only the file's end has one, as a whole read does
        else:
            raise ValueError(f"encoding={encoding!r} does not end lines with the byte \\n, so the file cannot "
                             "be read in byte ranges; keep it whole with max_partition_bytes=None")
        if drop_empty_lines:
            lines = [line for line in lines if line.strip()]
        for start in builtins.range(0, len(lines), READ_BATCH_ROWS):
            table = pa.table({"text": pa.array(lines[start:start + READ_BATCH_ROWS], pa.string())})
            yield opts.finish(table, fragment.path)

    return reader


@with_read_resources
def read_binary_files(paths, *, include_paths: bool = False, filesystem=None,
                      arrow_open_stream_args: dict | None = None, partitioning=None,
                      ignore_missing_paths: bool = False, file_extensions: list[str] | None = None,
                      partition_filter=None, override_num_blocks: int | None = None,
                      meta_provider=None, shuffle=None) -> Dataset:
    """One row per file: its ``bytes`` (decompressed when its name ends in a codec's suffix, as Ray
    opens every file) and, with ``include_paths=True``, its ``path``
    (Ray's default, False; epoch reads of ``binary_files`` keep the path, `epochs/runner.py`)."""
    _check_blocks(override_num_blocks, "read_binary_files", meta_provider)
    paths = normalize_paths(paths, "read_binary_files")
    opts = file_options("read_binary_files", filesystem=filesystem, partitioning=partitioning,
                        include_paths=include_paths, ignore_missing_paths=ignore_missing_paths,
                        file_extensions=file_extensions, arrow_open_stream_args=arrow_open_stream_args,
                        partition_filter=partition_filter)
    paths = provider_paths(meta_provider, paths, opts)
    return _files("BinaryFiles", paths, _binary_reader(opts), opts, override_num_blocks, shuffle)


def _binary_reader(opts: FileOptions):
    def reader(fragment: Fragment):
        with opts.open_stream(fragment.path) as handle:
            data = handle.read()
        yield opts.finish(pa.table({"bytes": pa.array([data], pa.binary())}), fragment.path)

    return reader


@with_parallelism
def from_items(items: list, *, override_num_blocks: int | None = None) -> Dataset:
    """A dataset of Python items: dicts become rows; anything else an ``item`` column."""
    _check_blocks(override_num_blocks, "from_items")
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"from_items expects a list, got {type(items).__name__}")
    return Dataset([Read(items_datasource(list(items)), override_num_blocks)])


@with_parallelism
def range(n: int, *, override_num_blocks: int | None = None) -> Dataset:  # noqa: A001 - Ray Data's name
    """Integers ``0 .. n-1`` in an ``id`` column."""
    _check_blocks(override_num_blocks, "range")
    check_positive_int(n, "range: n", allow_zero=True)
    return Dataset([Read(range_datasource(n), override_num_blocks)])


LINE_FORMATS = frozenset({"csv", "json", "text"})  # formats whose partitions may be byte ranges of lines
_FRAGMENT_READERS = {  # input format -> (the files) -> reader of one fragment, with its read_* defaults
    "parquet": lambda files: _parquet_reader(files, None, file_options("read_parquet", partitioning=HIVE)),
    "csv": lambda files: _csv_reader(files, {}, file_options("read_csv", partitioning=HIVE)),
    "json": lambda files: _json_reader(False, file_options("read_json", partitioning=HIVE)),
    "text": lambda files: _text_reader("utf-8", True),
    "binary_files": lambda files: _binary_reader(file_options("read_binary_files", include_paths=True)),
}
