"""Parsing helpers of the ``read_*`` functions: pyarrow's CSV option objects, and JSON as Ray Data reads it."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from airflow_streambatch.engine.errors import FileReadError

def first_readable(files: list[str], schema_of, kind: str, opener) -> tuple[str, pa.Schema]:
    """The first readable file and its schema; unreadable ones fail in their own read task."""
    problems = []
    for path in files:
        try:
            with opener(path) as handle:
                return path, schema_of(handle)
        except (OSError, pa.ArrowException) as exc:
            problems.append(f"{path}: {exc}")
    raise FileReadError(f"Failed to read {kind} file: no readable {kind} file among the inputs (check their format, "
                        "or leave other files out with partition_filter= or file_extensions=):\n" + "\n".join(problems))


def open_csv_file(handle, args: dict, path: str) -> pacsv.CSVStreamingReader:
    """``pyarrow.csv.open_csv``; a file that is not CSV fails with Ray's error and type."""
    try:
        return pacsv.open_csv(handle, **args)
    except pa.ArrowInvalid as exc:
        raise FileReadError(f"Failed to read CSV file: {path}: {exc}. Check the file's format, or leave files that "
                            "are not CSV out with partition_filter= or file_extensions=") from exc


_CSV_OPTION_TYPES = {"parse_options": pacsv.ParseOptions, "read_options": pacsv.ReadOptions,
                     "convert_options": pacsv.ConvertOptions}


def check_csv_args(parse_options, read_options, convert_options) -> dict:
    """``pyarrow.csv.open_csv`` keyword arguments, each checked to be pyarrow's option object."""
    given = {"parse_options": parse_options, "read_options": read_options, "convert_options": convert_options}
    for name, value in given.items():
        if value is not None and not isinstance(value, _CSV_OPTION_TYPES[name]):
            raise TypeError(f"read_csv: {name} must be a pyarrow.csv.{_CSV_OPTION_TYPES[name].__name__}, "
                            f"got {type(value).__name__}")
    return {name: value for name, value in given.items() if value is not None}


def csv_range_args(csv_args: dict, expected: pa.Schema) -> dict:
    """How a byte range of a CSV file is parsed: ``header`` (whether the file's first line is a
    header to put before the range's lines) and the ``open_csv`` arguments, with the first
    file's column types unless ``convert_options`` sets them."""
    read_options = csv_args.get("read_options")
    header = not (read_options and (read_options.column_names or read_options.autogenerate_column_names))
    if read_options and (read_options.skip_rows or read_options.skip_rows_after_names):
        header = None  # rows skipped at the file's start: a range cannot know which
    args = dict(csv_args)
    if "convert_options" not in args:
        args["convert_options"] = pacsv.ConvertOptions(
            column_types={f.name: f.type for f in expected if not pa.types.is_null(f.type)})
    return {"header": header, "args": args}


def schema_drift(expected: pa.Schema, found: pa.Schema) -> str:
    """How ``found`` differs from ``expected``, for an error that names both files."""
    want, got = dict(zip(expected.names, expected.types)), dict(zip(found.names, found.types))
    parts = [f"missing {name!r}" for name in want if name not in got]
    parts += [f"extra {name!r}" for name in got if name not in want]
    parts += [f"{name!r} is {got[name]} not {want[name]}" for name in want if name in got and got[name] != want[name]]
    if not parts and found.names != expected.names:
        parts.append(f"columns {found.names} are in another order than {expected.names}")
    return ", ".join(parts)


def csv_compatible(expected: pa.Schema, found: pa.Schema) -> bool:
    """Same columns in the same order, each of the expected type or null (an empty column)."""
    if found.names != expected.names:
        return False
    return all(f.type == e.type or pa.types.is_null(f.type) for f, e in zip(found, expected))


def cast_null_columns(table: pa.Table, expected: pa.Schema) -> pa.Table:
    if table.schema.equals(expected):
        return table
    return table.cast(expected)  # only null columns differ (checked by csv_compatible); null casts to any type


JSON_ARGS = {"read_options": pajson.ReadOptions, "parse_options": pajson.ParseOptions}


def check_json_args(args: dict) -> dict:
    """``read_json``'s ``**arrow_json_args``: Arrow's ``read_options`` and ``parse_options``, checked."""
    for name, value in args.items():
        if name not in JSON_ARGS:
            raise TypeError(f"read_json: unexpected argument {name!r}; arrow_json_args are {sorted(JSON_ARGS)}")
        if not isinstance(value, JSON_ARGS[name]):
            raise TypeError(f"read_json: {name} must be a pyarrow.json.{JSON_ARGS[name].__name__}, "
                            f"got {type(value).__name__}")
    return args


def json_table(data: bytes, lines: bool, whole: bool, json_args: dict | None = None) -> pa.Table:
    """One JSON file's (or byte range's) rows.

    ``lines=False`` (Ray's default): Arrow's JSON Lines reader, and where it fails on a
    whole file, Python's ``json``: an array of objects is one row per object, one
    object is one row. ``lines=True``: JSON Lines only, each line one row.
    ``json_args``: Arrow's ``read_options``/``parse_options`` (an ``explicit_schema``
    also types the rows Python's ``json`` parsed).
    """
    json_args = json_args or {}
    parse = json_args.get("parse_options")
    schema = parse.explicit_schema if parse is not None else None
    if not lines and whole and data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"[":
        return pa.Table.from_pylist(json.loads(data), schema=schema)
    try:
        return _arrow_json(data, json_args)
    except pa.ArrowInvalid as exc:
        if lines and whole:
            table = _json_arrays(data, schema)
            if table is not None:
                return table
        if lines or not whole:
            hint = " with lines=True every line must be one JSON object or array;" if lines else ""
            raise ValueError(f"not JSON Lines:{hint} {exc}") from exc
        parsed = json.loads(data)
    if isinstance(parsed, dict):
        return pa.Table.from_pylist([parsed], schema=schema)
    if isinstance(parsed, list) and all(isinstance(row, dict) for row in parsed):
        return pa.Table.from_pylist(parsed, schema=schema)
    raise ValueError(f"a JSON file must hold objects (one per line, an array of them, or one), got "
                     f"{type(parsed).__name__}")


def _arrow_json(data: bytes, json_args: dict) -> pa.Table:
    """Arrow's JSON Lines reader. A block size smaller than a row ("straddling object straddles
    two block boundaries"), Arrow's default 1 MiB too when no ``read_options`` are given, is
    doubled until the row fits, as Ray's reader does (a line of several MB reads); the caller's
    options object is left as it was."""
    json_args = {"read_options": pajson.ReadOptions(use_threads=False), **json_args}
    while True:
        try:
            return pajson.read_json(io.BytesIO(data), **json_args)
        except pa.ArrowInvalid as exc:
            options = json_args["read_options"]
            if "straddling" not in str(exc) or options.block_size > len(data):
                raise
            grown = pajson.ReadOptions(use_threads=options.use_threads, block_size=options.block_size * 2)
            json_args = {**json_args, "read_options": grown}


def _json_arrays(data: bytes, schema: pa.Schema | None) -> pa.Table | None:
    """JSON Lines whose every line is an array (``["a", "b"]``): one row per line, columns named
    by position ("0", "1", ...), a shorter line's missing values null, as pandas' ``read_json``
    (Ray's reader for ``lines=True``) gives them. None when the lines are not all arrays."""
    try:
        rows = [json.loads(line) for line in data.splitlines() if line.strip()]
    except ValueError:
        return None
    if not rows or not all(isinstance(row, list) for row in rows):
        return None
    width = max(len(row) for row in rows)
    columns = {str(i): [row[i] if i < len(row) else None for row in rows] for i in range(width)}
    return pa.Table.from_pydict(columns, schema=schema)
