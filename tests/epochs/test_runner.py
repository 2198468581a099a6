"""run_epoch without Airflow: the checkpoint rules the operator relies on."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from pipelines import write_inputs

from airflow_streambatch.epochs import (
    EpochCheckpoint,
    EpochManifest,
    EpochRecord,
    PartitionDirectory,
    list_inputs,
    load_pipeline,
    make_frontier,
    run_epoch,
)

END = datetime(2026, 11, 22, 11, tzinfo=timezone.utc)


def _manifest(tmp_path, partitions=2) -> EpochManifest:
    write_inputs(tmp_path / "in", partitions=partitions)
    return EpochManifest("2026-11-22T10:00:00+00:00", END.isoformat(), list_inputs(str(tmp_path / "in")))


def _identity(ds, epoch):
    return ds


def test_a_run_commits_every_partition_and_records_it_next_to_the_output(ctx, tmp_path):
    manifest = _manifest(tmp_path)
    record = run_epoch(manifest, _identity, output_path=str(tmp_path / "out"))
    assert record.status == "succeeded" and record.summary()["rows"] == 200
    on_disk = EpochCheckpoint(str(tmp_path / "out")).load()
    assert on_disk.to_dict() == record.to_dict()
    assert EpochRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    assert [op["name"] for op in record.metrics["operators"]] == ["ReadParquet->WriteParquet"]

    again = run_epoch(manifest, _identity, output_path=str(tmp_path / "out"))  # a clear after success
    assert again.tries == 1 and not any(p.this_try for p in again.partitions)


def test_an_empty_epoch_succeeds_without_spark_work(ctx, tmp_path):
    manifest = EpochManifest("2026-11-22T10:00:00+00:00", END.isoformat(), [])
    record = run_epoch(manifest, _identity, output_path=str(tmp_path / "out"))
    assert record.status == "succeeded" and record.partitions == []


def test_inputs_changed_between_the_sensor_and_the_run_are_refused(ctx, tmp_path):
    manifest = _manifest(tmp_path)
    write_inputs(tmp_path / "in", partitions=2, rows=10)
    with pytest.raises(ValueError, match="changed after the epoch's manifest was taken"):
        run_epoch(manifest, _identity, output_path=str(tmp_path / "out"))


def test_pipeline_errors_name_what_to_fix(ctx, tmp_path):
    with pytest.raises(ValueError, match="must be 'module:function'"):
        load_pipeline("pipelines.score")
    with pytest.raises(ImportError, match="cannot import pipeline module 'no_such_module'"):
        load_pipeline("no_such_module:fn")
    with pytest.raises(ValueError, match="has no function 'nope'"):
        load_pipeline("pipelines:nope")
    with pytest.raises(TypeError, match="must return an airflow_streambatch Dataset, got list"):
        run_epoch(_manifest(tmp_path), "pipelines:not_a_dataset", output_path=str(tmp_path / "out"))
    with pytest.raises(ValueError, match="output_format='xml'"):
        run_epoch(_manifest(tmp_path), _identity, output_path=str(tmp_path / "out"), output_format="xml")


def test_partition_directory_frontier_needs_the_directory_and_its_files(tmp_path):
    frontier = make_frontier("directory", str(tmp_path / "in"))
    assert isinstance(frontier, PartitionDirectory)
    assert frontier.poll(END, {}, None, 0.0) == (False, None)
    write_inputs(tmp_path / "in", partitions=1)
    listing = {p.path: [p.size, p.mtime] for p in list_inputs(str(tmp_path / "in"))}
    assert frontier.poll(END, listing, None, 0.0) == (True, None)
    with pytest.raises(ValueError, match="needs watermark_path"):
        make_frontier("watermark", "/in")
