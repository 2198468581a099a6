"""What a third rerun of Ray Data's own read tests (test_csv.py, test_json.py, test_text.py,
test_binary.py, test_numpy.py, test_parquet.py) against the engine showed missing on the read side:
metadata providers that list a read's files as Ray's do (and the base class that implements
nothing), ``read_parquet_bulk``, ``PartitionStyle``, ``PathPartitionFilter.of(None)``,
``read_binary_files``' order and default, Ray's ``ValueError`` for a read left with no file, JSON
lines of several MB, ``read_parquet``'s ``batch_size``/``_block_udf``/``tensor_column_schema``, and
a partition column that the file has too.

Written from Ray Data's documented behaviour and its implementation's rules, on real local Spark.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.datasource import (
    BaseFileMetadataProvider,
    DefaultFileMetadataProvider,
    FastFileMetadataProvider,
    FileMetadataProvider,
    PartitionStyle,
    Partitioning,
    PathPartitionFilter,
)
from airflow_streambatch.engine.extensions.tensor_extension import ArrowTensorType


def _csv_dir(root, names=("a.csv", "b.csv")):
    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        (root / name).write_text(f"id\n{i}\n")
    return root


# -- metadata providers ---------------------------------------------------------------------------
@pytest.mark.parametrize("read", ["read_csv", "read_json", "read_text", "read_binary_files", "read_numpy"])
def test_base_provider_implements_nothing_so_the_read_call_raises(ctx, tmp_path, read):
    path = tmp_path / "f.npy"
    np.save(path, np.arange(3))
    with pytest.raises(NotImplementedError, match="BaseFileMetadataProvider does not implement expand_paths"):
        getattr(rd, read)(str(path), meta_provider=BaseFileMetadataProvider())  # at the call, as Ray lists
    with pytest.raises(NotImplementedError):
        FileMetadataProvider()([str(path)])
    with pytest.raises(NotImplementedError):
        BaseFileMetadataProvider()([str(path)], rows_per_file=None, file_sizes=[None])


def test_the_read_reads_what_the_provider_lists(ctx, tmp_path):
    root = _csv_dir(tmp_path / "in", ("a.csv", "b.csv", "c.csv"))

    class Only(DefaultFileMetadataProvider):  # a provider that lists differently is obeyed
        calls = 0

        def expand_paths(self, paths, filesystem=None, partitioning=None, ignore_missing_paths=False):
            Only.calls += 1
            return [(p, s) for p, s in super().expand_paths(paths, filesystem, partitioning, ignore_missing_paths)
                    if not p.endswith("b.csv")]

    ds = rd.read_csv(str(root), meta_provider=Only())
    assert Only.calls == 1  # listed once, when read_csv was called
    assert sorted(r["id"] for r in ds.take_all()) == [0, 2]
    assert Only.calls == 1
    fast = rd.read_csv([str(root / "c.csv")], meta_provider=FastFileMetadataProvider())
    assert fast.take_all() == [{"id": 2}]
    with pytest.raises(ValueError, match="ignore_missing_paths"):
        rd.read_csv(str(root), meta_provider=FastFileMetadataProvider(), ignore_missing_paths=True)
    with pytest.raises(FileNotFoundError):
        rd.read_csv(str(root / "gone.csv"), meta_provider=DefaultFileMetadataProvider())


def test_default_provider_lists_on_s3(ctx, s3_bucket):
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    for name in ("a.csv", "b.csv"):
        with fs.open_output_stream(f"{bucket}/in/{name}") as out:
            out.write(b"one\n1\n")
    assert [p for p, _ in DefaultFileMetadataProvider().expand_paths([f"{s3_bucket}/in"])] == \
        [f"{s3_bucket}/in/a.csv", f"{s3_bucket}/in/b.csv"]
    ds = rd.read_csv(f"{s3_bucket}/in", meta_provider=DefaultFileMetadataProvider())
    assert [r["one"] for r in ds.take_all()] == [1, 1]
    with pytest.raises(NotImplementedError):
        rd.read_csv(f"{s3_bucket}/in", meta_provider=BaseFileMetadataProvider())


# -- read_parquet_bulk ----------------------------------------------------------------------------
def _two_parquet(root):
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"one": [1, 2, 3], "two": ["a", "b", "c"]}), root / "test1.parquet")
    pq.write_table(pa.table({"one": [4, 5, 6], "two": ["e", "f", "g"]}), root / "test2.parquet")
    return [str(root / "test1.parquet"), str(root / "test2.parquet")]


def test_read_parquet_bulk_reads_named_files_only(ctx, tmp_path):
    paths = _two_parquet(tmp_path / "in")
    with pytest.raises(ValueError, match="No input files found to read with the following file extensions"):
        rd.read_parquet_bulk(str(tmp_path / "in"))  # the directory's name does not end in .parquet
    with pytest.raises(OSError, match="reads files only"):
        rd.read_parquet_bulk(str(tmp_path / "in"), file_extensions=None).schema()
    (tmp_path / "in" / "foo.txt").write_text("not parquet")
    ds = rd.read_parquet_bulk(paths + [str(tmp_path / "in" / "foo.txt")])
    assert ds.input_files() == paths
    assert sorted((r["one"], r["two"]) for r in ds.take_all()) == [(1, "a"), (2, "b"), (3, "c"), (4, "e"),
                                                                    (5, "f"), (6, "g")]
    assert rd.read_parquet_bulk(paths, columns=["two"], include_paths=True).columns() == ["two", "path"]
    listed = rd.read_parquet_bulk(str(tmp_path / "in"), meta_provider=DefaultFileMetadataProvider())
    assert listed.count() == 6


def test_read_parquet_bulk_reads_files_of_different_schemas(ctx, tmp_path):
    pq.write_table(pa.table({"a": [1]}), tmp_path / "x.parquet")
    pq.write_table(pa.table({"b": ["z"]}), tmp_path / "y.parquet")
    rows = rd.read_parquet_bulk([str(tmp_path / "x.parquet"), str(tmp_path / "y.parquet")]).take_all()
    assert sorted(map(str, rows)) == ["{'a': 1}", "{'b': 'z'}"]
    with pytest.raises(ValueError, match="read_parquet_bulk: arrow_open_file_args"):
        rd.read_parquet_bulk(str(tmp_path / "x.parquet"), arrow_open_file_args={"buffer_size": 10})


def test_read_parquet_bulk_on_s3(ctx, s3_bucket):
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    pq.write_table(pa.table({"one": [1, 2]}), f"{bucket}/in/a.parquet", filesystem=fs)
    assert rd.read_parquet_bulk(f"{s3_bucket}/in/a.parquet").take_all() == [{"one": 1}, {"one": 2}]
    assert rd.read_parquet_bulk(f"{bucket}/in/a.parquet", filesystem=fs).count() == 2


# -- PartitionStyle, PathPartitionFilter.of(None) ---------------------------------------------------
def test_partition_style_is_rays_string_enum(ctx, tmp_path):
    assert (PartitionStyle.HIVE.value, PartitionStyle.DIRECTORY.value) == ("hive", "dir")
    assert PartitionStyle.HIVE == "hive" and Partitioning(PartitionStyle.HIVE) == Partitioning("hive")
    assert Partitioning("dir", field_names=["k"]).style is PartitionStyle.DIRECTORY
    root = tmp_path / "dir"
    (root / "us").mkdir(parents=True)
    (root / "us" / "x.txt").write_text("hi\n")
    scheme = Partitioning(PartitionStyle.DIRECTORY, base_dir=str(root), field_names=["country"])
    assert rd.read_text(str(root), partitioning=scheme).take_all() == [{"text": "hi", "country": "us"}]
    with pytest.raises(ValueError, match="is not 'hive' or 'dir'"):
        Partitioning("flat")


def test_partition_filter_without_a_function_keeps_every_file(ctx, tmp_path):
    root = _csv_dir(tmp_path / "in")
    keep_all = PathPartitionFilter.of(None, style=PartitionStyle.HIVE)
    assert sorted(r["id"] for r in rd.read_csv(str(root), partition_filter=keep_all).take_all()) == [0, 1]
    assert keep_all(["a", "b"]) == ["a", "b"]
    with pytest.raises(TypeError, match="filter_fn must be callable or None"):
        PathPartitionFilter.of("yes")


# -- read_binary_files ------------------------------------------------------------------------------
def test_binary_files_come_in_path_order_without_a_path_column(ctx, tmp_path):
    paths = []
    for i in (3, 0, 7, 1, 9, 2, 8, 4, 6, 5, 11, 10):
        path = tmp_path / f"{i}.bin"
        path.write_bytes(str(i).encode() * 300)
        paths.append(str(path))
    ctx.execution_options.preserve_order = True  # iteration is in completion order otherwise (Ray's default)
    rows = list(rd.read_binary_files(paths).iter_rows())
    assert [r["bytes"] for r in rows] == [open(p, "rb").read() for p in paths]
    assert [r["bytes"] for r in rd.read_binary_files(paths).take_all()] == [open(p, "rb").read() for p in paths]
    assert set(rows[0]) == {"bytes"}  # Ray's include_paths=False
    assert rd.read_binary_files(paths[:1], include_paths=True).take_all() == [
        {"bytes": b"3" * 300, "path": paths[0]}]


# -- a read left with no file -------------------------------------------------------------------------
def test_no_file_left_is_rays_value_error_and_a_file_not_found(ctx, tmp_path):
    (tmp_path / "test3").write_text("one\n1\n")
    with pytest.raises(ValueError, match="No input files found to read") as raised:
        rd.read_csv(str(tmp_path / "test3"), file_extensions=["csv"]).schema()
    assert isinstance(raised.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError, match="No input files found to read"):
        rd.read_csv(str(tmp_path), partition_filter=PathPartitionFilter.of(lambda d: False)).take_all()


# -- JSON ----------------------------------------------------------------------------------------------
def _big_jsonl(write, chars=2_500_000):
    rows = [{"one": "a" * chars, "two": "b" * chars} for _ in range(3)]
    write("".join(json.dumps(r) + "\n" for r in rows).encode())
    return rows


def test_json_lines_of_several_mb_read_with_default_options(ctx, tmp_path):
    path = tmp_path / "big.json"
    rows = _big_jsonl(path.write_bytes)
    ds = rd.read_json(str(path))
    assert ds.take_all() == rows
    assert rd.read_json(str(path), lines=True).count() == 3


def test_json_lines_of_several_mb_on_s3(ctx, s3_bucket):
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)

    def write(data):
        with fs.open_output_stream(f"{bucket}/big.jsonl") as out:
            out.write(data)

    rows = _big_jsonl(write, 1_500_000)
    assert [len(r["one"]) for r in rd.read_json(f"{s3_bucket}/big.jsonl").take_all()] == [len(r["one"]) for r in rows]


# -- read_parquet's batch_size, _block_udf, tensor_column_schema ---------------------------------------
def test_read_parquet_batch_size_and_block_udf(ctx, tmp_path):
    pq.write_table(pa.table({"one": list(range(100))}), tmp_path / "a.parquet", row_group_size=50)

    def plus_one(table: pa.Table) -> pa.Table:
        return table.set_column(0, "one", pa.compute.add(table.column("one"), 1))

    ds = rd.read_parquet(str(tmp_path), batch_size=7, _block_udf=plus_one, override_num_blocks=2)
    assert sorted(r["one"] for r in ds.take_all()) == list(range(1, 101))
    with pytest.raises(ValueError, match="read_parquet: batch_size must be a positive integer"):
        rd.read_parquet(str(tmp_path), batch_size=0)
    with pytest.raises(TypeError, match="read_parquet: unexpected argument"):
        rd.read_parquet(str(tmp_path), use_legacy_dataset=True)


def test_read_parquet_tensor_column_schema(ctx, tmp_path):
    arr = np.arange(5 * 8, dtype=np.int32).reshape(5, 2, 2, 2)
    pq.write_table(pa.table({"id": list(range(5)), "t": [a.tobytes() for a in arr]}), tmp_path / "t.parquet")
    ds = rd.read_parquet(str(tmp_path), tensor_column_schema={"t": (np.int32, (2, 2, 2))})
    assert isinstance(ds.schema().base_schema.field("t").type, ArrowTensorType)
    rows = sorted(ds.take_all(), key=lambda r: r["id"])
    for row, expected in zip(rows, arr):
        np.testing.assert_array_equal(row["t"], expected)
    with pytest.raises(Exception, match="is 32 bytes, not the 64 bytes of an array"):
        rd.read_parquet(str(tmp_path), tensor_column_schema={"t": (np.int64, (2, 2, 2))}).take_all()


# -- a partition column that the file has too ----------------------------------------------------------
def test_a_partition_column_in_the_file_keeps_the_files_type(ctx, tmp_path):
    for value in (1, 3):
        part = tmp_path / f"one={value}"
        part.mkdir()
        (part / "x.csv").write_text(f"one,two\n{value},a\n{value},b\n")
    ds = rd.read_csv(str(tmp_path))
    assert sorted((r["one"], r["two"]) for r in ds.take_all()) == [(1, "a"), (1, "b"), (3, "a"), (3, "b")]
    assert ds.schema().base_schema.field("one").type == pa.int64()
    os.rename(tmp_path / "one=3", tmp_path / "one=4")
    with pytest.raises(ValueError, match="partition value '4' is different from in-data values: \\[3\\]"):
        rd.read_csv(str(tmp_path)).take_all()
