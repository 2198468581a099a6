"""Flat cost per partition (issue 15, item 3): bounded XCom, a journaled record that survives a kill.

XCom and the Task State Store get a bounded summary and pointers; the manifest and
the record live in durable files. A run that died before its final snapshot leaves
the start snapshot and the journal (its last line possibly cut short), and the next
try resumes from them and the commit records on real local Spark.
"""

from __future__ import annotations

import json
import logging

import pytest
from pipelines import take_partitions_run, write_inputs

from airflow_streambatch.epochs import EpochCheckpoint, EpochManifest, InputPartition, list_inputs, run_epoch
from airflow_streambatch.epochs.checkpoint import EpochRecord, PartitionStatus
from airflow_streambatch.epochs.manifest_store import (
    manifest_dir_beside,
    manifest_from_xcom,
    manifest_pointer,
    write_manifest,
)
from airflow_streambatch.epochs.summary import MAX_FAILED_SHOWN, epoch_summary

XCOM_BUDGET = 64 * 1024


def _size(value) -> int:
    return len(json.dumps(value).encode())


def _huge_manifest(n: int) -> EpochManifest:
    long_dir = "s3://bucket/" + "deeply/nested/" * 40  # 572-character paths
    return EpochManifest("2026-11-22T09:00:00+00:00", "2026-11-22T10:00:00+00:00",
                         [InputPartition(f"{long_dir}part-{i:06d}.parquet", 1000 + i, 1.7e9 + i) for i in range(n)])


def test_the_xcom_summary_stays_under_64_kib_with_20000_partitions_and_5000_failures(tmp_path):
    manifest = _huge_manifest(20_000)
    record = EpochRecord.start(manifest, "s3://bucket/out/2026-11-22")
    for i, part in enumerate(manifest.partitions):
        if i % 4 == 3:
            record.partitions[i] = PartitionStatus(i, part.path, "failed", operator="Map(score)->WriteParquet",
                                                   error="ValueError: " + "e" * 20_000, traceback="t" * 4000)
        elif i % 4 != 2:
            record.partitions[i] = PartitionStatus(i, part.path, "committed", rows=7, bytes=100,
                                                   files=[f"p{i:05d}/part-0.parquet"], this_try=True)
    record.status, record.reason = "failed", "error: " + "r" * 50_000
    assert _size(record.to_dict()) > 40 * XCOM_BUDGET  # what XCom carried before

    summary = epoch_summary(record, manifest_uri="s3://bucket/manifests/m.json")
    assert _size(summary) < XCOM_BUDGET
    assert (summary["partitions"], summary["committed"], summary["failed"], summary["pending"]) == (20_000, 10_000,
                                                                                                   5_000, 5_000)
    assert summary["rows"] == 70_000 and summary["bytes"] == 1_000_000
    assert [f["index"] for f in summary["failed_partitions"]] == [4 * k + 3 for k in range(MAX_FAILED_SHOWN)]
    assert summary["failed_left_out"] == 5_000 - MAX_FAILED_SHOWN
    first = summary["failed_partitions"][0]
    assert first["error"].startswith("ValueError: ee") and first["error"].endswith("...")
    assert first["path"].endswith("part-000003.parquet") and len(first["path"]) <= 300
    assert summary["record_uri"] == "s3://bucket/out/2026-11-22/_epoch.json"
    assert summary["manifest_uri"] == "s3://bucket/manifests/m.json"

    pointer = manifest_pointer(manifest, "s3://bucket/manifests/m.json")
    assert _size(pointer) < 1024 and pointer["partitions"] == 20_000
    assert _size(pointer) + _size(summary) < XCOM_BUDGET  # the epoch's XCom: sensor + operator


def test_the_sensor_pointer_reads_back_the_manifest_and_refuses_another(tmp_path):
    write_inputs(tmp_path / "in", partitions=3)
    manifest = EpochManifest("a", "b", list_inputs(str(tmp_path / "in")))
    directory = manifest_dir_beside(str(tmp_path / "out") + "/")
    assert directory == f"{tmp_path}/out/_manifests"
    pointer = manifest_pointer(manifest, write_manifest(manifest, directory))
    assert list_inputs(str(tmp_path / "out"), missing_ok=True) == []  # not a file of the output

    read, uri = manifest_from_xcom(json.dumps(pointer))
    assert read == manifest and uri == pointer["manifest_uri"] and uri.startswith("file://")
    assert manifest_from_xcom(manifest.to_dict()) == (manifest, None)  # a whole manifest (older sensors)

    with pytest.raises(ValueError, match="was replaced since the sensor froze the epoch"):
        manifest_from_xcom({**pointer, "fingerprint": "0" * 16})
    with pytest.raises(ValueError, match="needs a 'manifest_uri' or a 'partitions' list"):
        manifest_from_xcom({k: v for k, v in pointer.items() if k != "manifest_uri"})
    (tmp_path / "out" / "_manifests").rename(tmp_path / "elsewhere")
    with pytest.raises(FileNotFoundError, match="rerun the sensor"):
        manifest_from_xcom(pointer)


def test_the_spark_submit_spec_points_to_a_frozen_manifest_instead_of_holding_it(tmp_path):
    from airflow_streambatch.epochs.job import EpochJob

    manifest = _huge_manifest(20_000)
    uri = write_manifest(manifest, str(tmp_path / "_manifests"))
    spec = EpochJob(pipeline="m:f", manifest=manifest, manifest_uri=uri, output_path="/out").to_spec()
    assert _size(spec) < 1024 and "manifest" not in spec  # 20,000 partitions, a few hundred bytes
    assert EpochJob.from_spec(json.loads(json.dumps(spec))).manifest == manifest
    inline = EpochJob(pipeline="m:f", manifest=manifest, output_path="/out").to_spec()  # no frozen file (input_path=)
    assert EpochJob.from_spec(inline).manifest == manifest and "manifest_uri" not in inline
    with pytest.raises(ValueError, match="was replaced since the sensor froze the epoch"):
        EpochJob.from_spec({**spec, "fingerprint": "0" * 16})


def test_a_killed_run_resumes_from_snapshot_and_journal_with_a_cut_last_line(ctx, tmp_path, monkeypatch, caplog):
    write_inputs(tmp_path / "in", partitions=4)
    manifest = EpochManifest("2026-11-22T09:00:00+00:00", "2026-11-22T10:00:00+00:00",
                             list_inputs(str(tmp_path / "in")))
    out, runs = str(tmp_path / "out"), tmp_path / "runs"
    (tmp_path / "fail").write_text("")
    kwargs = {"runs_dir": str(runs), "fail_flag": str(tmp_path / "fail"), "fail_partitions": [1, 3]}

    # the first try's driver is killed after its commits: its start snapshot is the last one it wrote
    real_save, saves = EpochCheckpoint.save, []

    def start_snapshot_only(self, rec):
        saves.append(rec.status)
        if len(saves) == 1:
            real_save(self, rec)

    monkeypatch.setattr(EpochCheckpoint, "save", start_snapshot_only)
    run_epoch(manifest, "pipelines:score", output_path=out, pipeline_kwargs=kwargs)
    assert saves == ["running", "failed"]
    monkeypatch.setattr(EpochCheckpoint, "save", real_save)
    assert sorted(set(take_partitions_run(runs))) == [0, 1, 2, 3]

    snapshot = json.loads((tmp_path / "out" / "_epoch.json").read_text())
    assert snapshot["status"] == "running" and {p["state"] for p in snapshot["partitions"]} == {"pending"}
    journal = (tmp_path / "out" / "_epoch.log").read_text().splitlines()
    assert sorted(json.loads(line)["index"] for line in journal) == [0, 2]  # one line per commit
    cut = json.dumps({"try": 1, "index": 3, "path": manifest.paths[3], "state": "committed"})[:-9]
    with open(tmp_path / "out" / "_epoch.log", "a") as f:  # the driver died in the middle of a line
        f.write(json.dumps({"try": 0, "index": 1, "path": "x", "state": "committed"}) + "\n" + cut)

    with caplog.at_level(logging.WARNING, logger="airflow_streambatch.epochs"):
        record = EpochCheckpoint(out).load()
    assert any("skipped 1 unreadable line(s) of _epoch.log" in r.getMessage() for r in caplog.records)
    assert record.status == "running" and record.tries == 1
    assert [p.state for p in record.partitions] == ["committed", "pending", "committed", "pending"]  # try 0: ignored
    assert record.partitions[0].rows == 100 and record.partitions[0].this_try

    (tmp_path / "fail").unlink()
    retry = run_epoch(manifest, "pipelines:score", output_path=out, pipeline_kwargs=kwargs)
    assert take_partitions_run(runs) == [1, 3]  # only what has no commit record
    assert retry.status == "succeeded" and retry.tries == 2
    assert [p.this_try for p in retry.partitions] == [False, True, False, True]
    assert not (tmp_path / "out" / "_epoch.log").exists()
    assert EpochCheckpoint(out).load().to_dict() == retry.to_dict()

    again = run_epoch(manifest, "pipelines:score", output_path=out, pipeline_kwargs=kwargs)  # unchanged: a no-op
    assert take_partitions_run(runs) == [] and again.tries == 2
