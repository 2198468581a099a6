"""Partitions that fit the work: a large Parquet file is several row-group ranges, each its own
read task, commit and unit of retry.

The issue's case is a 2 GiB Parquet file of 16 row groups under the 128 MiB default. CI uses
a small stand-in with the same shape: a ~125 KiB file of 16 row groups (~7.5 KiB each) under
``max_partition_bytes=32 KiB``, which splits the same way (4 ranges of 4 row groups).
Row group ``g`` holds ids ``100*g .. 100*g + 99``, so `pipelines.score` logs row-group
indices as the "partitions" it saw and can fail the range holding a chosen row group.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os

import pendulum
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipelines import take_partitions_run

from airflow_streambatch.epochs import EpochManifest, InputPartition, list_inputs, read_epoch, run_epoch
from airflow_streambatch.epochs.manifest import split_partitions

SMALL = 32 * 1024  # the CI stand-in for the 128 MiB default (see the module docstring)
START, END = "2026-11-22T10:00:00+00:00", "2026-11-22T11:00:00+00:00"
RANGES = [(0, 4), (4, 8), (8, 12), (12, 16)]


def write_row_groups(path, groups: int = 16, rows: int = 100, first: int = 0) -> None:
    """Row group ``g`` holds ids ``first + 100*g ..``; hex digests keep it ~7.5 KiB even compressed."""
    ids = [first + 100 * g + r for g in range(groups) for r in range(rows)]
    text = [hashlib.sha256(str(n).encode()).hexdigest() for n in ids]
    pq.write_table(pa.table({"id": ids, "text": text}), str(path), row_group_size=rows)


def _inputs(tmp_path) -> str:
    """One large file of 16 row groups and one small file (ids 1600..1649) that stays whole."""
    directory = tmp_path / "in"
    directory.mkdir()
    write_row_groups(directory / "a-large.parquet")
    write_row_groups(directory / "b-small.parquet", groups=1, rows=50, first=1600)
    return str(directory)


def _output_ids(out) -> list[int]:
    return sorted(i for f in glob.glob(f"{out}/p*/*.parquet") for i in pq.read_table(f)["id"].to_pylist())


def test_a_large_parquet_file_becomes_row_group_ranges_in_a_backward_compatible_manifest(tmp_path):
    whole = EpochManifest(START, END, list_inputs(_inputs(tmp_path)))
    large, small = whole.partitions
    split = whole.split(SMALL)

    expected = [(large.path, r) for r in RANGES] + [(small.path, None)]
    assert [(p.path, p.row_groups) for p in split.partitions] == expected
    assert all(p.size == large.size and p.mtime == large.mtime for p in split.partitions[:4])  # the file's identity
    assert all(0 < p.range_bytes <= SMALL for p in split.partitions[:4])
    assert split.files == [large.path, small.path] and split.total_bytes == whole.total_bytes
    assert split.split(SMALL) == split and whole.split(None) == whole  # idempotent; None keeps files whole
    assert whole.split(10**9) == whole  # files under the limit are never opened or split

    data = json.loads(json.dumps(split.to_dict()))
    assert data["partitions"][0]["row_groups"] == [0, 4] and "row_groups" not in data["partitions"][4]
    assert EpochManifest.from_dict(data) == split and EpochManifest.from_dict(data).fingerprint == split.fingerprint
    assert split.fingerprint != whole.fingerprint

    # a manifest written before ranges existed loads and fingerprints exactly as it did
    old = [{"path": p.path, "size": p.size, "mtime": p.mtime, "etag": None} for p in whole.partitions]
    assert whole.to_dict()["partitions"] == old
    assert EpochManifest.from_dict({"interval_start": START, "interval_end": END, "partitions": old}) == whole
    assert whole.fingerprint == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:16]


def test_partition_settings_and_ranges_are_checked_with_errors_that_name_them(tmp_path):
    with pytest.raises(ValueError, match="max_partition_bytes must be a positive integer"):
        split_partitions([], 0)
    with pytest.raises(ValueError, match=r"manifest partition /in/x.parquet: row_groups must be \[start, stop\)"):
        InputPartition("/in/x.parquet", 10, row_groups=[3, 3])
    blob = tmp_path / "big.bin"
    blob.write_bytes(b"x" * 100)
    assert split_partitions(list_inputs(str(blob)), 10) == list_inputs(str(blob))  # neither Parquet nor lines: whole
    manifest = EpochManifest(START, END, list_inputs(_inputs(tmp_path))).split(SMALL)
    with pytest.raises(ValueError, match="splits files into ranges that input_format='csv' cannot read "
                                         r"\(.*a-large.parquet \[row groups 0-3\] is a Parquet row-group range.*"
                                         "max_partition_bytes=None"):
        read_epoch(manifest, "csv")

    from airflow_streambatch.sensors.epoch import EpochSensor

    with pytest.raises(ValueError, match="EpochSensor wait: max_partition_bytes must be a positive integer or None"):
        EpochSensor(task_id="wait", input_path="/in", max_partition_bytes=-1)


def test_each_range_is_one_read_task_and_the_ranges_hold_every_row_once(ctx, tmp_path):
    manifest = EpochManifest(START, END, list_inputs(_inputs(tmp_path))).split(SMALL)
    record = run_epoch(manifest, lambda ds, epoch: ds, output_path=str(tmp_path / "out"))

    assert record.status == "succeeded" and len(record.partitions) == 5
    assert record.metrics["operators"][0]["tasks"] == 5
    assert [p.rows for p in record.partitions] == [400, 400, 400, 400, 50]
    assert record.partitions[1].path.endswith("a-large.parquet [row groups 4-7]")
    assert _output_ids(tmp_path / "out") == list(range(1650))
    identities = {json.loads(open(f).read())["inputs"] for f in glob.glob(f"{tmp_path}/out/p*/_commit.json")}
    assert len(identities) == 5  # the ranges of one file differ by their row groups


def test_a_failure_in_one_range_fails_only_it_and_a_rerun_reruns_only_that_range(ctx, tmp_path):
    manifest = EpochManifest(START, END, list_inputs(_inputs(tmp_path))).split(SMALL)
    runs, fail, out = str(tmp_path / "runs"), tmp_path / "fail", str(tmp_path / "out")
    kwargs = {"runs_dir": runs, "fail_flag": str(fail), "fail_partitions": [5]}
    fail.write_text("")

    first = run_epoch(manifest, "pipelines:score", output_path=out, pipeline_kwargs=kwargs)
    assert [p.state for p in first.partitions] == ["committed", "failed", "committed", "committed", "committed"]
    assert "scorer rejects partition(s) [5]" in first.partitions[1].error
    assert "row groups 4-7" in first.partitions[1].path
    assert sorted(set(take_partitions_run(runs))) == list(range(17))

    fail.unlink()
    second = run_epoch(manifest, "pipelines:score", output_path=out, pipeline_kwargs=kwargs)
    assert second.status == "succeeded" and second.tries == 2
    assert take_partitions_run(runs) == [4, 5, 6, 7]  # only the failed range's row groups ran again
    assert [p.this_try for p in second.partitions] == [False, True, False, False, False]
    assert _output_ids(out) == list(range(1650))


def test_dag_test_splits_in_the_sensor_and_a_clear_reruns_only_the_failed_range(ctx, airflow_db, tmp_path):
    """dag.test twice for one logical date: the second run is the Clear (it resumes from the commit records)."""
    from row_group_test_dags import sb_epoch_row_groups

    epoch_in = tmp_path / "in" / "2026-11-22"
    epoch_in.mkdir(parents=True)
    write_row_groups(epoch_in / "part-000.parquet")
    (epoch_in / "_SUCCESS").write_text("")
    (tmp_path / "fail").write_text("")
    out, runs = tmp_path / "out" / "2026-11-22", str(tmp_path / "runs")
    os.makedirs(runs)
    logical = pendulum.datetime(2026, 11, 22, 10, tz="UTC")

    def run() -> dict:
        dr = sb_epoch_row_groups.test(logical_date=logical, run_after=logical,
                                      run_conf={"root": str(tmp_path), "fail_partitions": [9]})
        return {ti.task_id: ti.state for ti in dr.get_task_instances()}

    assert run() == {"wait_for_epoch": "success", "score": "failed"}
    record = json.loads((out / "_epoch.json").read_text())
    assert [p["row_groups"] for p in record["epoch"]["partitions"]] == [list(r) for r in RANGES]
    assert [p["state"] for p in record["partitions"]] == ["committed", "committed", "failed", "committed"]
    take_partitions_run(runs)

    (tmp_path / "fail").unlink()
    assert run() == {"wait_for_epoch": "success", "score": "success"}
    assert take_partitions_run(runs) == [8, 9, 10, 11]
    assert _output_ids(out) == list(range(1600))


def test_an_operator_without_a_sensor_splits_its_input_path_too(ctx, airflow_db, tmp_path):
    from row_group_test_dags import sb_epoch_row_groups_no_sensor

    epoch_in = tmp_path / "in" / "2026-11-22"
    epoch_in.mkdir(parents=True)
    write_row_groups(epoch_in / "part-000.parquet")
    out, runs = tmp_path / "out" / "2026-11-22", tmp_path / "runs"
    runs.mkdir()
    logical = pendulum.datetime(2026, 11, 22, 10, tz="UTC")
    dr = sb_epoch_row_groups_no_sensor.test(logical_date=logical, run_after=logical, run_conf={"root": str(tmp_path)})
    assert {ti.task_id: ti.state for ti in dr.get_task_instances()} == {"score": "success"}
    record = json.loads((out / "_epoch.json").read_text())
    assert [p["row_groups"] for p in record["epoch"]["partitions"]] == [list(r) for r in RANGES]
    assert _output_ids(out) == list(range(1600))


def test_changing_max_partition_bytes_mid_epoch_is_refused_naming_the_setting(ctx, tmp_path):
    """The same files split differently would commit rows twice: the refusal says the partitioning
    changed, not that files were rewritten."""
    from airflow_streambatch.epochs.checkpoint import EpochChangedError

    listed = list_inputs(_inputs(tmp_path))
    out = str(tmp_path / "out")
    run_epoch(EpochManifest(START, END, listed).split(None), lambda ds, epoch: ds, output_path=out)
    with pytest.raises(EpochChangedError, match="split into partitions differently: max_partition_bytes changed"):
        run_epoch(EpochManifest(START, END, listed).split(SMALL), lambda ds, epoch: ds, output_path=out)
    assert _output_ids(out) == list(range(1650))
