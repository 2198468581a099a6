"""One epoch job, one run object, states as enums (issue 29): no Spark here, each test well under a second.

* `EpochJob` is what travels operator -> spec -> spark-submit driver -> runner: the driver's
  `EpochJob.from_spec` rebuilds the job the operator built, and a key a spec lacks takes the
  job's own default (the only defaults there are);
* `EpochRun` keeps one try's record through ``start``, ``commit`` and ``fail``;
* records written before `EpochState`/`PartitionState` existed (plain strings, on local disk
  and on the S3 server) load as the enums and are written back as the same strings.
"""

from __future__ import annotations

import dataclasses
import json

import pyarrow.compute as pc
import pytest

from airflow_streambatch.engine.filesystems import resolve
from airflow_streambatch.engine.output.commit import CommitRecord
from airflow_streambatch.engine.output.target import OutputTarget
from airflow_streambatch.epochs import epoch_run as epoch_run_module
from airflow_streambatch.epochs.checkpoint import EpochCheckpoint
from airflow_streambatch.epochs.epoch_run import EpochRun
from airflow_streambatch.epochs.job import EpochJob
from airflow_streambatch.epochs.manifest import EpochManifest, list_inputs
from airflow_streambatch.epochs.manifest_store import write_manifest
from airflow_streambatch.epochs.pipeline_by_value import encode_pipeline
from airflow_streambatch.epochs.states import EpochState, PartitionState
from airflow_streambatch.epochs.summary import epoch_summary

START, END = "2026-11-22T09:00:00+00:00", "2026-11-22T10:00:00+00:00"


def _manifest(directory, files: int = 2) -> EpochManifest:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (directory / f"part-{i}.txt").write_text(f"line {i}\n")
    return EpochManifest(START, END, list_inputs(str(directory)))


def _through_the_spec_file(job: EpochJob) -> EpochJob:
    """What the spark-submit driver gets: the spec as JSON text, read back."""
    return EpochJob.from_spec(json.loads(json.dumps(job.to_spec())))


def _tagged(ds, epoch, tag="x"):
    return f"{tag}:{len(epoch.partitions)}"


def test_a_job_with_only_its_required_arguments_is_the_one_the_driver_rebuilds(tmp_path):
    job = EpochJob(pipeline="pipelines:score", manifest=_manifest(tmp_path / "in"), output_path="/out")
    assert _through_the_spec_file(job) == job
    # a spec written by hand with only what has no default: the job's defaults fill in the rest
    minimal = {"manifest": job.manifest.to_dict(), "pipeline": "pipelines:score", "output_path": "/out"}
    assert EpochJob.from_spec(minimal) == job


def test_every_field_of_the_job_travels_in_the_spec(tmp_path):
    job = EpochJob(pipeline="pipelines:score", manifest=_manifest(tmp_path / "in"), output_path="/out",
                   input_format="csv", output_format="json", output_options={"compression": "gzip"},
                   pipeline_kwargs={"threshold": 0.7}, full_recompute=True,
                   data_context={"memory_limit": 1 << 30}, columns=["id", "lang"],
                   row_filter=pc.field("lang") == "en", app_name="streambatch-dag-task")
    defaults = EpochJob(pipeline=job.pipeline, manifest=job.manifest, output_path=job.output_path)
    left_default = [f.name for f in dataclasses.fields(EpochJob) if f.name not in ("manifest_uri", "row_filter")
                    and getattr(job, f.name) == getattr(defaults, f.name) and f.name not in ("pipeline", "manifest",
                                                                                              "output_path")]
    assert not left_default and defaults.row_filter is None  # every field differs from its default (manifest_uri:
    # test_the_spec_points_to_a_manifest_frozen_on_the_s3_server)
    rebuilt = _through_the_spec_file(job)
    assert rebuilt == job
    assert rebuilt.row_filter.equals(pc.field("lang") == "en")
    # equality compares the filter too (pyarrow's == builds an expression, always truthy)
    assert dataclasses.replace(rebuilt, row_filter=pc.field("lang") == "de") != job
    assert dataclasses.replace(rebuilt, columns=["id"]) != job


def test_the_spec_points_to_a_manifest_frozen_on_the_s3_server(tmp_path, s3_bucket):
    manifest = _manifest(tmp_path / "in", files=3)
    uri = write_manifest(manifest, f"{s3_bucket}/_manifests")
    job = EpochJob(pipeline="pipelines:score", manifest=manifest, manifest_uri=uri, output_path=f"{s3_bucket}/out")
    spec = job.to_spec()
    assert "manifest" not in spec and spec["manifest_uri"] == uri
    assert _through_the_spec_file(job) == job


def test_a_function_travels_only_pickled_by_value(tmp_path):
    job = EpochJob(pipeline=_tagged, manifest=_manifest(tmp_path / "in"), output_path="/out")
    with pytest.raises(ValueError, match="encode_pipeline"):
        job.to_spec()
    shipped = dataclasses.replace(job, pipeline=encode_pipeline(_tagged, where="test"))
    rebuilt = _through_the_spec_file(shipped)
    assert rebuilt.pipeline(None, rebuilt.manifest, tag="y") == "y:2"
    assert dataclasses.replace(rebuilt, pipeline=_tagged) == job


def test_an_epoch_run_records_its_start_each_commit_and_why_it_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(epoch_run_module, "PROGRESS_INTERVAL_S", 0.0)
    job = EpochJob(pipeline="pipelines:score", manifest=_manifest(tmp_path / "in"), output_path=str(tmp_path / "out"))
    progress = []
    with OutputTarget.open(job.output_path) as target:
        run = EpochRun(job, job.output(), target, on_progress=lambda r: progress.append(r.by_state("committed")))
        assert run.start() is None  # partitions to run
        assert EpochCheckpoint(job.output_path).load().status is EpochState.RUNNING
        run.commit(CommitRecord(0, "part-0.txt", ["p0/a.parquet"], rows=5, bytes=100, run_id="r1"))
        assert run.committed == 1 and len(progress[-1]) == 1
        run.fail(SystemExit("received SIGTERM"))
    record = EpochCheckpoint(job.output_path).load()
    assert record.status is EpochState.FAILED and record.reason.startswith("interrupted: terminated")
    assert [p.state for p in record.partitions] == [PartitionState.COMMITTED, PartitionState.PENDING]
    assert record.partitions[0].rows == 5 and record.partitions[0].this_try and record.tries == 1
    with OutputTarget.open(job.output_path) as target:  # the next try counts on from this record
        assert EpochRun(job, job.output(), target).start() is None
    assert EpochCheckpoint(job.output_path).load().tries == 2


def _old_record(output_path: str) -> str:
    """``_epoch.json`` as the versions before the state enums wrote it, states as plain strings."""
    return json.dumps({
        "epoch": {"interval_start": START, "interval_end": END, "partitions": []},
        "fingerprint": "0123456789abcdef", "output_path": output_path, "status": "failed",
        "reason": "error: boom", "partitions": [
            {"index": 0, "path": "in/a", "state": "committed", "rows": 3, "bytes": 30, "files": ["p0/x.parquet"],
             "run_id": "r1", "this_try": True, "operator": None, "error": None, "traceback": None,
             "quarantined": 0},
            {"index": 1, "path": "in/b", "state": "failed", "rows": 0, "bytes": 0, "files": [], "run_id": None,
             "this_try": False, "operator": "MapBatches(f)", "error": "ValueError: bad", "traceback": "tb",
             "quarantined": 0},
            {"index": 2, "path": "in/c", "state": "pending", "rows": 0, "bytes": 0, "files": [], "run_id": None,
             "this_try": False, "operator": None, "error": None, "traceback": None, "quarantined": 0}],
        "metrics": {}, "spark_ui_url": None, "tries": 2, "table": None, "updated_at": 1.7e9})


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_record_written_with_plain_string_states_loads_as_the_enums_and_saves_the_same_strings(
        where, tmp_path, request):
    out = str(tmp_path / "out") if where == "local" else f"{request.getfixturevalue('s3_bucket')}/out"
    fs, root = resolve(out)
    fs.create_dir(root, recursive=True)
    with fs.open_output_stream(f"{root}/_epoch.json") as f:
        f.write(_old_record(out).encode())
    with fs.open_output_stream(f"{root}/_epoch.log") as f:  # a journal line of the same try: pending -> committed
        f.write(json.dumps({"try": 2, "at": 1.7e9, "index": 2, "path": "in/c", "state": "committed", "rows": 1,
                            "bytes": 10, "files": ["p2/y.parquet"], "run_id": "r2", "this_try": True}).encode())

    checkpoint = EpochCheckpoint(out)
    record = checkpoint.load()
    assert record.status is EpochState.FAILED
    assert [p.state for p in record.partitions] == [PartitionState.COMMITTED, PartitionState.FAILED,
                                                    PartitionState.COMMITTED]
    assert all(type(p.state) is PartitionState for p in record.partitions)
    assert [p.index for p in record.by_state(PartitionState.COMMITTED)] == [0, 2]
    summary = epoch_summary(record)  # XCom and the Task State Store: the same plain strings as before
    assert type(summary["status"]) is str and summary["status"] == "failed"
    assert (summary["committed"], summary["failed"], summary["pending"]) == (2, 1, 0)
    assert all(type(k) is str for k in record.counts())

    checkpoint.save(record)
    with fs.open_input_stream(f"{root}/_epoch.json") as f:
        saved = json.loads(f.read())
    assert saved["status"] == "failed" and type(saved["status"]) is str
    assert [p["state"] for p in saved["partitions"]] == ["committed", "failed", "committed"]
    assert EpochCheckpoint(out).load().to_dict() == record.to_dict()
