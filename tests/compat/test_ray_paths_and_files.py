"""Ray Data's file arguments (issue 32): paths given as ``pathlib.Path``, ``shuffle=`` on reads,
compressed inputs (Snappy's framing format as Ray's tests write it with python-snappy), and
``filesystem=`` on the writes, each as Ray Data documents it, on real local Spark and on the
moto S3 server."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import os
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import snappy

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.plan.datasource import Fragment
from airflow_streambatch.engine.read_api import read_fragments


def _framed_snappy(data: bytes) -> bytes:
    """``data`` in Snappy's framing format, as Ray's own tests write ``.snappy`` files."""
    out = io.BytesIO()
    snappy.stream_compress(io.BytesIO(data), out)
    return out.getvalue()


def _ids(ds) -> list[int]:
    return sorted(row["id"] for row in ds.take_all())


# -- paths as pathlib.Path ------------------------------------------------------------------
def test_every_read_takes_a_path_object_and_a_list_of_them(ctx, tmp_path):
    """Ray resolves ``pathlib.Path`` (and lists of paths) in every ``read_*``."""
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"id": [1, 2]}), src / "a.parquet")
    pq.write_table(pa.table({"id": [3]}), src / "b.parquet")
    (src / "c.csv").write_text("id\n4\n5\n")
    (src / "d.json").write_text('{"id": 6}\n{"id": 7}\n')
    (src / "e.txt").write_text("x\ny\n")

    assert _ids(rd.read_parquet(src)) == [1, 2, 3]
    assert _ids(rd.read_parquet([src / "a.parquet", src / "b.parquet"])) == [1, 2, 3]
    assert _ids(rd.read_csv(src / "c.csv")) == [4, 5]
    assert _ids(rd.read_json([src / "d.json"])) == [6, 7]
    assert sorted(r["text"] for r in rd.read_text(src / "e.txt").take_all()) == ["x", "y"]
    rows = rd.read_binary_files([src / "e.txt", pathlib.PurePosixPath(src / "c.csv")], include_paths=True).take_all()
    assert sorted(r["bytes"] for r in rows) == [b"id\n4\n5\n", b"x\ny\n"]
    assert sorted(r["path"] for r in rows) == [str(src / "c.csv"), str(src / "e.txt")]
    size = os.path.getsize(src / "a.parquet")
    assert _ids(read_fragments([Fragment(src / "a.parquet", size)])) == [1, 2]


@pytest.mark.parametrize("read, paths, message", [
    (rd.read_parquet, 42, "read_parquet: expected paths to be a str, a pathlib.Path"),
    (rd.read_csv, [], "read_csv: must provide at least one path"),
    (rd.read_json, ["a.json", 3], "read_json: expected paths"),
    (rd.read_text, {"a.txt"}, "read_text: expected paths"),
    (rd.read_binary_files, None, "read_binary_files: expected paths"),
])
def test_paths_of_another_type_are_refused_naming_the_read(paths, read, message):
    with pytest.raises(ValueError, match=message):
        read(paths)


def test_writes_take_a_path_object_with_rows_per_file(ctx, tmp_path):
    """``write_*`` with a ``pathlib.Path``, and Ray's rows-per-file arguments with it."""
    out = tmp_path / "out"
    result = rd.range(40, override_num_blocks=1).write_parquet(out, max_rows_per_file=15)
    assert result.rows == 40 and len(result.files) == 3  # 15 + 15 + 10
    with pytest.warns(DeprecationWarning, match="num_rows_per_file is deprecated"):
        rd.range(10, override_num_blocks=1).write_csv(tmp_path / "csv", num_rows_per_file=5)
    rd.range(6, override_num_blocks=2).write_json(tmp_path / "json", min_rows_per_file=2)
    assert _ids(rd.read_parquet(out)) == list(range(40))
    assert _ids(rd.read_csv(tmp_path / "csv")) == list(range(10))
    assert _ids(rd.read_json(tmp_path / "json")) == list(range(6))
    with pytest.raises(ValueError, match="write_parquet: expected path to be a str or a pathlib.Path"):
        rd.range(1).write_parquet([out])


# -- shuffle= -------------------------------------------------------------------------------
def _file_order(ds) -> list[str]:
    return [os.path.basename(row["path"]) for row in ds.take_all()]


def _ray_order(names: list[str], seed: int) -> list[str]:
    """The order Ray gives files for ``seed``: numpy's default_rng(seed) shuffles the list."""
    ordered = list(names)
    np.random.default_rng(seed).shuffle(ordered)
    return ordered


def test_read_parquet_shuffles_its_files_as_ray_does(ctx, tmp_path):
    """``shuffle=FileShuffleConfig(seed)`` orders files as Ray's rule says, per execution unless
    ``reseed_after_execution=False``; ``"files"`` a new order each time, every row still read once."""
    ctx.execution_options.preserve_order = True  # rows come out in the order of the read's files
    names = [f"f{i}.parquet" for i in range(8)]
    for i, name in enumerate(names):
        pq.write_table(pa.table({"id": [i]}), tmp_path / name)
    fixed = rd.read_parquet(tmp_path, include_paths=True, override_num_blocks=8,
                            shuffle=rd.FileShuffleConfig(seed=7, reseed_after_execution=False))
    assert _file_order(fixed) == _file_order(fixed) == _ray_order(names, 7) != names
    reseeded = rd.read_parquet(tmp_path, include_paths=True, override_num_blocks=8,
                               shuffle=rd.FileShuffleConfig(seed=7))
    first, second = _file_order(reseeded), _file_order(reseeded)
    assert first == _ray_order(names, hash((7, 0)) % 2 ** 32)
    assert second == _ray_order(names, hash((7, 1)) % 2 ** 32) != first
    unseeded = rd.read_parquet(tmp_path, include_paths=True, override_num_blocks=8, shuffle="files")
    orders = [_file_order(unseeded) for _ in range(2)]
    assert all(sorted(order) == names for order in orders) and any(order != names for order in orders)
    assert _file_order(rd.read_parquet(tmp_path, include_paths=True, override_num_blocks=8)) == names


def test_invalid_shuffle_is_refused_naming_the_values_ray_takes(tmp_path):
    with pytest.raises(ValueError, match=r"read_parquet: invalid value for 'shuffle': True\. Valid values are "
                                         r"None, 'files', FileShuffleConfig"):
        rd.read_parquet(tmp_path, shuffle=True)
    with pytest.raises(ValueError, match="read_csv: invalid value for 'shuffle': 'rows'"):
        rd.read_csv(tmp_path, shuffle="rows")
    with pytest.raises(ValueError, match="seed must be an integer or None"):
        rd.FileShuffleConfig(seed="7")


# -- compressed inputs ----------------------------------------------------------------------
def test_snappy_framed_binary_files_read_as_ray_reads_them(ctx, tmp_path):
    """Ray's test_binary: a file python-snappy compressed reads back as its bytes, by the
    ``.snappy`` name or with ``arrow_open_stream_args={"compression": "snappy"}``."""
    payload = b"hello, world" * 1000
    (tmp_path / "named").mkdir()
    (tmp_path / "named" / "file.snappy").write_bytes(_framed_snappy(payload))
    (tmp_path / "told").mkdir()
    (tmp_path / "told" / "file").write_bytes(_framed_snappy(payload))
    assert [r["bytes"] for r in rd.read_binary_files(tmp_path / "named").take_all()] == [payload]
    told = rd.read_binary_files(tmp_path / "told", arrow_open_stream_args={"compression": "snappy"})
    assert [r["bytes"] for r in told.take_all()] == [payload]
    # a file that is not compressed stays as it is, as Ray reads it without a codec
    assert [r["bytes"] for r in rd.read_binary_files(tmp_path / "told").take_all()] == [_framed_snappy(payload)]


def test_snappy_framed_json_and_text_read_whole(ctx, tmp_path):
    (tmp_path / "rows.json.snappy").write_bytes(_framed_snappy(b'{"id": 1}\n{"id": 2}\n'))
    (tmp_path / "lines.txt.snappy").write_bytes(_framed_snappy(b"a\nb\n"))
    assert _ids(rd.read_json(tmp_path / "rows.json.snappy")) == [1, 2]
    assert [r["text"] for r in rd.read_text(tmp_path / "lines.txt.snappy").take_all()] == ["a", "b"]


# -- on the S3 server -----------------------------------------------------------------------
def test_reads_and_writes_with_filesystem_on_the_s3_server(ctx, tmp_path, s3_bucket):
    """``filesystem=`` on every write (paths inside it, no scheme), compressed reads inferred from
    the name, and a shuffled read, all against the S3 server."""
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    ds = rd.range(30, override_num_blocks=3)
    written = ds.write_parquet(f"{bucket}/pq", filesystem=fs, max_rows_per_file=4)
    assert written.rows == 30 and len(written.files) == 9  # 10 rows a partition: 4 + 4 + 2
    gzipped = ds.write_csv(f"{bucket}/csv", filesystem=fs, arrow_open_stream_args={"compression": "gzip"})
    ds.write_json(f"{bucket}/json", filesystem=fs)
    assert _ids(rd.read_parquet(f"{s3_bucket}/pq")) == list(range(30))
    assert _ids(rd.read_csv(f"{bucket}/csv", filesystem=fs)) == list(range(30))
    assert _ids(rd.read_json(f"{s3_bucket}/json", shuffle="files")) == list(range(30))
    assert gzipped.files and all(path.endswith(".csv.gz") for path in gzipped.files)

    with fs.open_output_stream(f"{bucket}/in/rows.json.gz", compression=None) as out:  # as given
        out.write(gzip.compress(b'{"id": 1}\n{"id": 2}\n'))
    with fs.open_output_stream(f"{bucket}/in/rows.csv.bz2", compression=None) as out:  # as given
        out.write(bz2.compress(b"id\n3\n"))
    with fs.open_output_stream(f"{bucket}/in/blob.snappy", compression=None) as out:  # as given
        out.write(_framed_snappy(b"raw bytes"))
    assert _ids(rd.read_json(f"{s3_bucket}/in/rows.json.gz")) == [1, 2]
    assert _ids(rd.read_csv(f"{s3_bucket}/in/rows.csv.bz2")) == [3]
    assert rd.read_binary_files(f"{s3_bucket}/in/blob.snappy").take_all()[0]["bytes"] == b"raw bytes"


def test_write_filesystem_is_where_the_path_lies_locally(ctx, tmp_path):
    """A relative path means a place inside ``filesystem`` (a subtree here), not the working
    directory: files, lease and commit records all land there; a non-pyarrow filesystem is refused."""
    tree = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    result = rd.range(12, override_num_blocks=2).write_parquet("out", filesystem=tree)
    assert result.rows == 12
    committed = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "out").rglob("*.parquet"))
    assert len(committed) == 2 and all(p.startswith("out/p0000") for p in committed)
    assert (tmp_path / "out" / "p00000" / "_commit.json").exists()
    assert not os.path.exists("out")  # not relative to the working directory
    rd.range(12, override_num_blocks=2).write_csv(pathlib.Path("csv"), filesystem=tree,
                                                  write_options=pacsv.WriteOptions(delimiter=";"))
    assert _ids(rd.read_csv(tmp_path / "csv", parse_options=pacsv.ParseOptions(delimiter=";"))) == list(range(12))
    with pytest.raises(TypeError, match="write_json: filesystem must be a pyarrow.fs.FileSystem, got dict"):
        rd.range(1).write_json("j", filesystem={"protocol": "s3"})
    assert json.loads((tmp_path / "out" / "_write.json").read_text())["state"] == "finished"
