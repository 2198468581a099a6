"""Partitions that fit the work, for line-based files: a large CSV, JSON Lines or text file is
several byte ranges, each its own read task, commit and unit of retry.

A range holds the lines that start in it (Hadoop's rule, `engine.worker.line_ranges`), so
the ranges of a file hold every line exactly once wherever the boundaries fall. CI uses
files of ~40-90 KiB under ``max_partition_bytes=8 KiB``: the same arithmetic as a 10 GiB
file under the 128 MiB default, with boundaries that land inside lines.
"""

from __future__ import annotations

import csv
import glob
import gzip
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipelines import take_partitions_run

from airflow_streambatch.engine.worker.line_ranges import read_line_range
from airflow_streambatch.epochs import EpochManifest, InputPartition, list_inputs, read_epoch, run_epoch

SMALL = 8 * 1024
START, END = "2026-11-22T10:00:00+00:00", "2026-11-22T11:00:00+00:00"
ROWS = 1600  # ids 0..1599: `pipelines.score` calls id // 100 a "partition" and can fail the range holding one


def _ranges(data: bytes, bounds: list[int]) -> list[bytes]:
    handle = pa.BufferReader(data)
    return [read_line_range(handle, start, stop) for start, stop in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("data", [
    b"", b"one line without an end", b"a\nb\n", b"a\n\n\nb", b"\n\n", b"crlf\r\nends\r\n",
    b"short\n" + b"x" * 5000 + b"\nlong line above\n",  # a line longer than several ranges
    "ünïcode läuft\nüber Grenzen\n".encode() * 50,
])
def test_the_ranges_of_a_file_hold_each_line_once_wherever_the_boundaries_fall(data):
    rng = random.Random(7)
    cuts = [[0, len(data)], [0, *range(1, len(data)), len(data)]]  # one range; a range per byte
    cuts += [sorted({0, len(data), *(rng.randrange(len(data) + 1) for _ in range(k))}) for k in (1, 3, 9, 40)]
    for bounds in cuts:
        pieces = _ranges(data, bounds)
        assert b"".join(pieces) == data, bounds
        filled = [p for p in pieces if p]
        assert all(p.endswith(b"\n") for p in filled[:-1])  # a range ends at a line's end
        # the lines of each range decode and split on their own as the whole file does
        assert [ln for p in pieces for ln in p.decode().splitlines()] == data.decode().splitlines()


def _write_inputs(directory) -> dict[str, str]:
    """One large file of each line-based format (ids 0..1599), a JSON array file and a gzipped CSV."""
    directory.mkdir()
    rows = [{"id": i, "name": f"name, {i}", "weight": i / 4} for i in range(ROWS)]
    with open(directory / "a.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["id", "name", "weight"])
        writer.writeheader()
        writer.writerows(rows)
    (directory / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "c.txt").write_text("".join(f"{r['id']} {'word ' * (r['id'] % 17)}\n" for r in rows))
    (directory / "d.json").write_text(json.dumps(rows))
    with gzip.open(directory / "e.csv.gz", "wt") as f:
        f.write("id\n" + "".join(f"{i}\n" for i in range(ROWS)))
    return {name: str(directory / name) for name in ("a.csv", "b.jsonl", "c.txt", "d.json", "e.csv.gz")}


def test_large_line_based_files_become_byte_ranges_that_a_manifest_records(tmp_path):
    files = _write_inputs(tmp_path / "in")
    whole = EpochManifest(START, END, list_inputs(str(tmp_path / "in")))
    split = whole.split(SMALL)

    by_file: dict[str, list[InputPartition]] = {}
    for part in split.partitions:
        by_file.setdefault(part.path, []).append(part)
    for name in ("a.csv", "b.jsonl", "c.txt"):
        parts, size = by_file[files[name]], by_file[files[name]][0].size
        assert len(parts) == -(-size // SMALL) > 1
        assert parts[0].byte_range[0] == 0 and parts[-1].byte_range[1] == size
        assert all(a.byte_range[1] == b.byte_range[0] for a, b in zip(parts, parts[1:]))  # contiguous, no gap
        assert all(p.range_bytes == p.byte_range[1] - p.byte_range[0] <= SMALL for p in parts)
    assert [p.whole for p in by_file[files["d.json"]]] == [True]  # one JSON array: cannot be cut at lines
    assert [p.whole for p in by_file[files["e.csv.gz"]]] == [True]  # compressed: not splittable
    assert split.split(SMALL) == split and split.total_bytes == whole.total_bytes

    data = json.loads(json.dumps(split.to_dict()))
    assert EpochManifest.from_dict(data) == split and EpochManifest.from_dict(data).fingerprint == split.fingerprint
    assert "byte_range" not in data["partitions"][-1] and split.fingerprint != whole.fingerprint
    with pytest.raises(ValueError, match="row_groups and byte_range exclude each other"):
        InputPartition("/in/a.csv", 10, row_groups=(0, 1), byte_range=(0, 5))
    with pytest.raises(ValueError, match=r"byte_range must be \[start, stop\)"):
        InputPartition("/in/a.csv", 10, byte_range=(5, 5))


def _epoch_rows(manifest, fmt, out) -> tuple:
    record = run_epoch(manifest, lambda ds, epoch: ds, output_path=str(out), input_format=fmt)
    assert record.status == "succeeded", record.summary()
    table = pa.concat_tables([pq.read_table(f) for f in sorted(glob.glob(f"{out}/p*/*.parquet"))])
    return record, sorted(table.to_pylist(), key=lambda r: json.dumps(r, sort_keys=True))


@pytest.mark.parametrize("name,fmt", [("a.csv", "csv"), ("b.jsonl", "json"), ("c.txt", "text")])
def test_each_byte_range_is_one_read_task_and_the_ranges_read_what_the_whole_file_reads(ctx, tmp_path, name, fmt):
    files = _write_inputs(tmp_path / "in")
    whole = EpochManifest(START, END, list_inputs(files[name]))
    split = whole.split(SMALL)
    assert len(split.partitions) > 3

    record, rows = _epoch_rows(split, fmt, tmp_path / "ranges")
    _, whole_rows = _epoch_rows(whole, fmt, tmp_path / "whole")
    assert rows == whole_rows and len(rows) == ROWS
    assert record.metrics["operators"][0]["tasks"] == len(split.partitions)
    assert sum(p.rows for p in record.partitions) == ROWS and all(p.rows > 0 for p in record.partitions)
    assert record.partitions[1].path == f"{files[name]} [bytes {split.partitions[1].byte_range[0]}-" \
                                        f"{split.partitions[1].byte_range[1]})"
    if fmt == "csv":  # every range parses its values with the header's columns and the file's types
        assert sorted(rows, key=lambda r: r["id"])[1001] == {"id": 1001, "name": "name, 1001", "weight": 250.25}


def test_a_failure_in_one_byte_range_reruns_only_that_range(ctx, tmp_path):
    files = _write_inputs(tmp_path / "in")
    manifest = EpochManifest(START, END, list_inputs(files["a.csv"])).split(SMALL)
    runs, fail, out = str(tmp_path / "runs"), tmp_path / "fail", str(tmp_path / "out")
    kwargs = {"runs_dir": runs, "fail_flag": str(fail), "fail_partitions": [9]}  # ids 900..999
    fail.write_text("")

    first = run_epoch(manifest, "pipelines:score", output_path=out, input_format="csv", pipeline_kwargs=kwargs)
    failed = [i for i, p in enumerate(first.partitions) if p.state == "failed"]
    assert failed and len(failed) < len(manifest.partitions) and first.status == "failed"
    assert all("scorer rejects partition(s) [9]" in first.partitions[i].error for i in failed)
    take_partitions_run(runs)

    with open(files["a.csv"], "rb") as f:  # the ids of the failed ranges, read as the reader reads them
        handle = pa.BufferReader(f.read())
    expected = sorted({int(line.split(b",")[0]) // 100 for i in failed
                       for line in read_line_range(handle, *manifest.partitions[i].byte_range).splitlines()
                       if line[:1].isdigit()})
    fail.unlink()
    second = run_epoch(manifest, "pipelines:score", output_path=out, input_format="csv", pipeline_kwargs=kwargs)
    assert second.status == "succeeded" and second.tries == 2
    assert sorted(set(take_partitions_run(runs))) == expected  # only the failed ranges' rows ran again
    assert [p.this_try for p in second.partitions] == [i in failed for i in range(len(manifest.partitions))]
    ids = sorted(i for f in glob.glob(f"{out}/p*/*.parquet") for i in pq.read_table(f)["id"].to_pylist())
    assert ids == list(range(ROWS))


def test_byte_ranges_need_a_line_based_input_format(ctx, tmp_path):
    files = _write_inputs(tmp_path / "in")
    manifest = EpochManifest(START, END, list_inputs(files["c.txt"])).split(SMALL)
    with pytest.raises(ValueError, match=r"input_format='binary_files' cannot read \(.*c.txt \[bytes 0-\d+\) is a "
                                         r"byte range of lines.*max_partition_bytes=None"):
        read_epoch(manifest, "binary_files")


@pytest.mark.parametrize("content", ["a\nb\n", "a\n\n\nb", "x" * 3000 + "\n\n" + "y" * 100 + "\n", "one\r\ntwo\r\n\n"])
@pytest.mark.parametrize("drop", [True, False])
def test_text_ranges_read_the_lines_ray_reads_from_the_whole_file(ctx, tmp_path, content, drop):
    """Ray Data's read_text: lines cut at \\n only; with drop_empty_lines=False the "" after a final \\n
    is a row, once, whichever range holds the file's end."""
    from airflow_streambatch.engine.plan.datasource import Fragment
    from airflow_streambatch.engine.read_api import _text_reader

    path = tmp_path / "t.txt"
    path.write_bytes(content.encode())
    expected = [ln for ln in content.split("\n") if not drop or ln.strip()]
    reader = _text_reader("utf-8", drop)
    for bounds in ([0, len(content)], [0, 1, 2, 3, len(content)], [0, len(content) // 2, len(content)],
                   [0, 2, 2500, 3001, len(content)] if len(content) > 3001 else [0, len(content)]):
        rows = [r for a, b in zip(bounds, bounds[1:]) if a < b
                for t in reader(Fragment(str(path), b - a, byte_range=(a, b))) for r in t["text"].to_pylist()]
        assert rows == expected, bounds
    whole = [r for t in reader(Fragment(str(path), len(content))) for r in t["text"].to_pylist()]
    assert whole == expected
