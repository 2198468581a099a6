"""Ray Data's ``write_parquet``, ``write_json`` and ``write_csv`` (issue 17, item 7), each test
pinned to what Ray's API reference documents for the argument, on real local Spark; the
engine keeps its exactly-once commit per partition underneath."""

from __future__ import annotations

import glob
import gzip
import json
import os

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as rd


def _files(out, pattern: str) -> list[str]:
    return sorted(glob.glob(os.path.join(str(out), "p*", pattern)))


def _parquet_rows_by_partition(out) -> dict[str, list[int]]:
    """Rows of each committed file, by partition directory."""
    counts: dict[str, list[int]] = {}
    for f in _files(out, "*.parquet"):
        counts.setdefault(os.path.basename(os.path.dirname(f)), []).append(pq.ParquetFile(f).metadata.num_rows)
    return counts


def test_max_rows_per_file_caps_every_file_and_keeps_every_row(ctx, tmp_path):
    """Ray: ``max_rows_per_file`` is the most rows a file gets; a task starts another file at the cap."""
    out = tmp_path / "out"
    result = rd.range(1000, override_num_blocks=2).write_parquet(str(out), max_rows_per_file=120)
    counts = _parquet_rows_by_partition(out)
    assert sorted(counts) == ["p00000", "p00001"]
    assert all(sorted(c) == [20, 120, 120, 120, 120] for c in counts.values())  # 500 rows a partition
    assert sorted(r["id"] for r in rd.read_parquet(str(out)).take_all()) == list(range(1000))
    assert result.rows == 1000 and len(result.files) == 10


def _every_fourth(batch: pa.Table) -> pa.Table:
    return batch.filter(pa.compute.equal(pa.compute.bit_wise_and(batch["id"], 3), 0))


def test_min_rows_per_file_bundles_small_blocks_into_fewer_files(ctx, tmp_path):
    """Ray: ``min_rows_per_file`` bundles input blocks until a write gets that many rows (a hint:
    the last file of a partition may have fewer). One partition here: blocks of different
    partitions are never bundled, each partition being committed alone."""
    ctx.target_max_block_size = 1600  # 200 int64 rows a block: the partition reads as 10 blocks
    out = tmp_path / "out"
    # num_cpus=0.5 keeps the filter apart from the read and from the write: its tasks emit 50-row blocks
    small = rd.range(2000, override_num_blocks=1).map_batches(_every_fourth, batch_format="pyarrow", num_cpus=0.5)
    small.write_parquet(str(out), min_rows_per_file=120)
    rows = _parquet_rows_by_partition(out)["p00000"]
    assert sum(rows) == 500 and len(rows) <= 4, rows  # 10 blocks of 50 rows, at least 3 to a file
    assert sum(r < 120 for r in rows) <= 1, rows
    assert sorted(r["id"] for r in rd.read_parquet(str(out)).take_all()) == list(range(0, 2000, 4))


def test_num_rows_per_file_is_deprecated_for_min_rows_per_file(ctx, tmp_path):
    """Ray: ``num_rows_per_file`` is deprecated in favour of ``min_rows_per_file`` and warns so."""
    with pytest.warns(DeprecationWarning, match="num_rows_per_file is deprecated; use min_rows_per_file"):
        result = rd.range(30, override_num_blocks=1).write_parquet(str(tmp_path / "out"), num_rows_per_file=10)
    assert result.rows == 30
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="not both"):
        rd.range(3).write_csv(str(tmp_path / "both"), num_rows_per_file=1, min_rows_per_file=1)


@pytest.mark.parametrize("call, message", [
    (lambda ds, p: ds.write_parquet(p, max_rows_per_file=0), r"max_rows_per_file=\.\.\.\) must be a positive"),
    (lambda ds, p: ds.write_json(p, min_rows_per_file=-1), r"min_rows_per_file=\.\.\.\) must be a positive"),
    (lambda ds, p: ds.write_csv(p, min_rows_per_file=1.5), r"min_rows_per_file=\.\.\.\) must be a positive"),
    (lambda ds, p: ds.write_parquet(p, min_rows_per_file=10, max_rows_per_file=5),
     "min_rows_per_file=10 is greater than max_rows_per_file=5"),
    (lambda ds, p: ds.write_parquet(p, compression="nope"), "pyarrow refused them"),
    (lambda ds, p: ds.write_parquet(p, row_group_size=0), r"row_group_size=\.\.\.\) must be a positive"),
    (lambda ds, p: ds.write_parquet(p, arrow_open_stream_args={"compression": "gzip"}),
     "pass compression='gzip' to write_parquet"),
    (lambda ds, p: ds.write_csv(p, arrow_open_stream_args={"compression": "snappy"}), "compression must be one of"),
    (lambda ds, p: ds.write_csv(p, arrow_open_stream_args={"mode": "w"}), r"unsupported key\(s\) \['mode'\]"),
    (lambda ds, p: ds.write_json(p, orient="split"), r"write_json\(orient='split'\): only Ray's default"),
    (lambda ds, p: ds.write_json(p, date_format="iso"), r"write_json\(date_format='iso'\)"),
])
def test_invalid_write_arguments_are_refused_naming_them(ctx, tmp_path, call, message):
    """Ray validates these arguments before writing; nothing is written or left behind."""
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=message):
        call(rd.range(10), str(out))
    assert not out.exists()


def test_unknown_pyarrow_writer_arguments_are_type_errors(ctx, tmp_path):
    """Ray hands ``**arrow_parquet_args``/``**arrow_csv_args`` to pyarrow, which refuses unknown keywords."""
    with pytest.raises(TypeError, match="pyarrow.parquet.ParquetWriter"):
        rd.range(10).write_parquet(str(tmp_path / "a"), nope=1)
    with pytest.raises(TypeError, match=r"unsupported argument\(s\) \['delimiter'\]; .* write_options"):
        rd.range(10).write_csv(str(tmp_path / "b"), delimiter=";")
    # Ray's own arguments this engine does not take are named, never handed to pyarrow to ignore
    with pytest.raises(TypeError, match=r"Ray Data's \['partition_cols'\] not supported"):
        rd.range(10).write_parquet(str(tmp_path / "c"), partition_cols=["id"])


def test_arrow_parquet_args_reach_the_parquet_writer(ctx, tmp_path):
    """Ray passes ``**arrow_parquet_args`` to pyarrow's Parquet writer: the codec is in the file's
    metadata, and ``row_group_size`` cuts row groups."""
    out = tmp_path / "out"
    rd.range(100, override_num_blocks=1).write_parquet(str(out), compression="gzip", row_group_size=30)
    (path,) = _files(out, "*.parquet")
    metadata = pq.ParquetFile(path).metadata
    assert metadata.row_group(0).column(0).compression == "GZIP"
    assert [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)] == [30, 30, 30, 10]
    assert sorted(r["id"] for r in rd.read_parquet(str(out)).take_all()) == list(range(100))


def test_gzip_csv_reads_back_with_read_csv_and_pyarrow(ctx, tmp_path):
    """Ray: ``arrow_open_stream_args={"compression": "gzip"}`` compresses each file; the codec's
    extension in the name lets readers, Ray's ``read_csv`` included, infer it."""
    out = tmp_path / "out"
    rows = [{"id": i, "name": f"n{i}"} for i in range(50)]
    options = pacsv.WriteOptions(delimiter=";")
    rd.from_items(rows).write_csv(str(out), arrow_open_stream_args={"compression": "gzip"}, write_options=options)
    files = _files(out, "part-*")
    assert files and all(f.endswith(".csv.gz") for f in files)
    with gzip.open(files[0], "rt") as f:
        assert f.readline().strip() == '"id";"name"'  # the write_options reached pyarrow's CSV writer
    parse = pacsv.ParseOptions(delimiter=";")
    back = rd.read_csv(str(out), parse_options=parse).take_all()
    assert sorted((r["id"], r["name"]) for r in back) == [(r["id"], r["name"]) for r in rows]
    direct = pa.concat_tables(pacsv.read_csv(f, parse_options=parse) for f in files)
    assert sorted(direct["id"].to_pylist()) == list(range(50))


def test_json_is_json_lines_as_rays_default_and_compresses(ctx, tmp_path):
    """Ray writes JSON with pandas ``orient="records", lines=True`` by default: one object a line;
    passing those defaults explicitly is accepted."""
    out = tmp_path / "out"
    rd.range(20, override_num_blocks=2).write_json(str(out), orient="records", lines=True,
                                                   arrow_open_stream_args={"compression": "gzip"})
    files = _files(out, "part-*")
    assert files and all(f.endswith(".jsonl.gz") for f in files)
    lines = [json.loads(line) for f in files for line in gzip.open(f, "rt")]
    assert sorted(row["id"] for row in lines) == list(range(20))
    assert sorted(r["id"] for r in rd.read_json(str(out)).take_all()) == list(range(20))


def test_write_after_repartition_commits_each_output_block_once(ctx, tmp_path):
    """Ray: ``repartition(n)`` before a write sets the number of output files; here each of the
    ``n`` blocks is one committed partition, and every row is written exactly once."""
    out = tmp_path / "out"
    result = rd.range(1000, override_num_blocks=3).repartition(4).write_parquet(str(out))
    assert sorted(result.committed) == [0, 1, 2, 3]
    assert [rec.rows for _, rec in sorted(result.committed.items())] == [250, 250, 250, 250]
    assert all(rec.label == f"block {j} of repartition(4)" for j, rec in result.committed.items())
    assert sorted(e for e in os.listdir(out) if not e.startswith("_")) == ["p00000", "p00001", "p00002", "p00003"]
    assert not (out / "_staging").exists()  # nothing uncommitted is left behind, nor an empty staging
    assert len(_files(out, "*.parquet")) == 4
    assert sorted(r["id"] for r in rd.read_parquet(str(out)).take_all()) == list(range(1000))


def test_write_after_repartition_with_a_map_and_max_rows_per_file(ctx, tmp_path):
    """A transform after the repartition keeps its blocks' partitions; ``max_rows_per_file`` still caps files."""
    out = tmp_path / "out"
    ds = rd.range(300, override_num_blocks=5).repartition(2).map(lambda r: {"id": r["id"], "twice": r["id"] * 2})
    result = ds.write_csv(str(out), max_rows_per_file=100)
    assert sorted(result.committed) == [0, 1] and result.rows == 300
    counts = sorted(pacsv.read_csv(f).num_rows for f in _files(out, "*.csv"))
    assert counts == [50, 50, 100, 100]
    back = rd.read_csv(str(out)).take_all()
    assert sorted(r["id"] for r in back) == list(range(300)) and all(r["twice"] == 2 * r["id"] for r in back)


def _poison_seven(batch: pa.Table) -> pa.Table:
    if 7 in batch["id"].to_pylist():
        raise ValueError("poisoned row 7")
    return batch


def test_a_failure_before_the_repartition_fails_the_whole_write(ctx, tmp_path):
    """Every output block of a repartition holds rows of every input partition: a failed input
    partition cannot be left out of one commit unit, so the write fails and commits nothing,
    even where ``max_failed_partitions`` would let a write without a repartition finish."""
    ctx.max_failed_partitions = 2
    ctx.max_task_retries = 0
    out = tmp_path / "out"
    ds = rd.range(40, override_num_blocks=4).map_batches(_poison_seven, batch_format="pyarrow").repartition(2)
    with pytest.raises(ValueError, match="poisoned row 7") as raised:
        ds.write_parquet(str(out))
    assert "follows a repartition()" in "\n".join(getattr(raised.value, "__notes__", []))
    assert not glob.glob(str(out / "p*"))


def test_a_failure_after_the_repartition_costs_only_its_output_block(ctx, tmp_path):
    """After the barrier each output block is one commit unit: a block that fails for good is
    left out (``max_failed_partitions`` allows it, with Ray's warning of a partial result), and
    every other block is committed whole."""
    ctx.max_failed_partitions = 1
    ctx.max_task_retries = 0
    out = tmp_path / "out"
    ds = rd.range(40, override_num_blocks=4).repartition(4).map_batches(_poison_seven, batch_format="pyarrow",
                                                                        num_cpus=0.5)
    with pytest.warns(rd.PartialResultWarning):
        result = ds.write_parquet(str(out))
    (failed,) = [f.partition for f in result.failed]  # the block row 7 landed in (blocks are cut in arrival order)
    assert sorted([*result.committed, failed]) == [0, 1, 2, 3]
    ids = [r["id"] for r in rd.read_parquet(str(out)).take_all()]
    assert len(ids) == len(set(ids)) == 30 and 7 not in ids and set(ids) < set(range(40))


def test_resume_after_repartition_is_refused_saying_why(ctx, tmp_path):
    """``mode="resume"`` skips partitions committed from the same input; after a repartition no
    output block maps to one input partition, so it is refused before anything runs."""
    with pytest.raises(ValueError, match=r"mode='resume'\) after repartition\(\).*mode='overwrite'"):
        rd.range(10).repartition(2).write_parquet(str(tmp_path / "out"), mode="resume")
    assert not (tmp_path / "out").exists()
    again = rd.range(10).repartition(2).write_parquet(str(tmp_path / "out"), mode="overwrite")
    assert again.rows == 10
