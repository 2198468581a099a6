"""Dataset constructors with Ray Data's names: ``read_*``, ``from_items``, ``range``.

Paths go through ``pyarrow.fs``: local paths, ``s3://``, ``gs://`` and ``hdfs://``.
Nothing is read here; listing and partitioning happen when a consumer runs.
"""

from __future__ import annotations

import builtins
import io
import json

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from airflow_streambatch.engine.dataset import Dataset, _positive_int
from airflow_streambatch.engine.datasource import (
    READ_BATCH_ROWS,
    Datasource,
    Fragment,
    expand_paths,
    file_datasource,
    items_datasource,
    range_datasource,
)
from airflow_streambatch.engine.plan import Read
from airflow_streambatch.engine.filesystems import resolve


def _check_blocks(override_num_blocks, where: str) -> None:
    if override_num_blocks is not None and (
        not isinstance(override_num_blocks, int) or isinstance(override_num_blocks, bool) or override_num_blocks <= 0
    ):
        raise ValueError(f"{where}: override_num_blocks must be a positive integer, got {override_num_blocks!r}")


def _open(path: str):
    fs, inner = resolve(path)
    return fs.open_input_file(inner)


def _schema_drift(expected: pa.Schema, found: pa.Schema) -> str:
    want, got = dict(zip(expected.names, expected.types)), dict(zip(found.names, found.types))
    parts = [f"missing {name!r}" for name in want if name not in got]
    parts += [f"extra {name!r}" for name in got if name not in want]
    parts += [f"{name!r} is {got[name]} not {want[name]}" for name in want if name in got and got[name] != want[name]]
    return ", ".join(parts)


def read_parquet(paths, *, columns: list[str] | None = None, override_num_blocks: int | None = None) -> Dataset:
    """Parquet files (a file, a directory, or a list); split by row groups when files are few.

    Every file must have the schema of the first one (checked as it is read): a file
    whose columns or types drifted fails its partition with an error naming both files.
    """
    _check_blocks(override_num_blocks, "read_parquet")
    suffixes = (".parquet", ".parq")

    def plan(slots: int, override: int | None, target_bytes: int):
        files = expand_paths(paths, suffixes)
        reference, expected = _reference_schema([path for path, _ in files])

        def reader(fragment: Fragment):
            with _open(fragment.path) as handle:
                pf = pq.ParquetFile(handle)
                if not pf.schema_arrow.equals(expected):
                    raise ValueError(f"schema drift: {_schema_drift(expected, pf.schema_arrow)} "
                                     f"(compared with {reference})")
                groups = list(fragment.row_groups) if fragment.row_groups is not None else None
                for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS, row_groups=groups, columns=columns):
                    yield pa.Table.from_batches([batch])

        listed = [path for path, _ in files]
        return file_datasource("Parquet", listed, suffixes, reader, _parquet_row_groups).plan(
            slots, override, target_bytes)

    return Dataset([Read(Datasource("Parquet", plan), override_num_blocks)])


def _reference_schema(files: list[str]) -> tuple[str, pa.Schema]:
    """The schema of the first readable file; unreadable ones fail in their own read task."""
    problems = []
    for path in files:
        try:
            with _open(path) as handle:
                return path, pq.ParquetFile(handle).schema_arrow
        except (OSError, pa.ArrowException) as exc:
            problems.append(f"{path}: {exc}")
    raise OSError("no readable parquet file among the inputs:\n" + "\n".join(problems))


def _parquet_row_groups(path: str, size: int) -> list[Fragment]:
    try:
        with _open(path) as handle:
            meta = pq.ParquetFile(handle).metadata
    except (OSError, pa.ArrowException):
        return [Fragment(path, size)]  # unreadable: its read task fails and names it
    if meta.num_row_groups <= 1:
        return [Fragment(path, size)]
    return [Fragment(path, meta.row_group(i).total_byte_size, (i,)) for i in builtins.range(meta.num_row_groups)]


def read_csv(paths, *, override_num_blocks: int | None = None) -> Dataset:
    """CSV files with a header row; types are inferred by Arrow."""
    _check_blocks(override_num_blocks, "read_csv")

    def reader(fragment: Fragment):
        with _open(fragment.path) as handle:
            for batch in pacsv.open_csv(handle):
                yield pa.Table.from_batches([batch])

    return Dataset([Read(file_datasource("CSV", paths, (), reader), override_num_blocks)])


def read_json(paths, *, override_num_blocks: int | None = None) -> Dataset:
    """JSON Lines files (one object per line), or files holding one JSON array of objects."""
    _check_blocks(override_num_blocks, "read_json")

    def reader(fragment: Fragment):
        with _open(fragment.path) as handle:
            data = handle.read()
        if data.lstrip()[:1] == b"[":
            yield pa.Table.from_pylist(json.loads(data))
        else:
            yield pajson.read_json(io.BytesIO(data))

    return Dataset([Read(file_datasource("JSON", paths, (), reader), override_num_blocks)])


def read_text(paths, *, encoding: str = "utf-8", drop_empty_lines: bool = False,
              override_num_blocks: int | None = None) -> Dataset:
    """One row per line, in a ``text`` column."""
    _check_blocks(override_num_blocks, "read_text")

    def reader(fragment: Fragment):
        with _open(fragment.path) as handle:
            lines = handle.read().decode(encoding).splitlines()
        if drop_empty_lines:
            lines = [line for line in lines if line.strip()]
        for start in builtins.range(0, len(lines), READ_BATCH_ROWS):
            yield pa.table({"text": pa.array(lines[start:start + READ_BATCH_ROWS], pa.string())})

    return Dataset([Read(file_datasource("Text", paths, (), reader), override_num_blocks)])


def read_binary_files(paths, *, include_paths: bool = True, override_num_blocks: int | None = None) -> Dataset:
    """One row per file: its ``bytes`` and, by default, its ``path``."""
    _check_blocks(override_num_blocks, "read_binary_files")

    def reader(fragment: Fragment):
        with _open(fragment.path) as handle:
            data = handle.read()
        columns = {"bytes": pa.array([data], pa.binary())}
        if include_paths:
            columns = {"path": pa.array([fragment.path]), **columns}
        yield pa.table(columns)

    return Dataset([Read(file_datasource("BinaryFiles", paths, (), reader), override_num_blocks)])


def from_items(items: list, *, override_num_blocks: int | None = None) -> Dataset:
    """A dataset of Python items: dicts become rows; anything else an ``item`` column."""
    _check_blocks(override_num_blocks, "from_items")
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"from_items expects a list, got {type(items).__name__}")
    return Dataset([Read(items_datasource(list(items)), override_num_blocks)])


def range(n: int, *, override_num_blocks: int | None = None) -> Dataset:  # noqa: A001 - Ray Data's name
    """Integers ``0 .. n-1`` in an ``id`` column."""
    _check_blocks(override_num_blocks, "range")
    _positive_int(n, "range: n", allow_zero=True)
    return Dataset([Read(range_datasource(n), override_num_blocks)])
