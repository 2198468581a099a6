"""Epoch metrics and progress (issue 15): true row counts for writers, k-of-N progress, bounded saves."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pyarrow.compute as pc
from pipelines import write_inputs

from airflow_streambatch.engine.protocol.staging import StagedFile
from airflow_streambatch.engine.protocol.tasks import TaskResult
from airflow_streambatch.engine.execution.stats import OpStats
from airflow_streambatch.epochs import EpochCheckpoint, EpochManifest, list_inputs, run_epoch
from airflow_streambatch.epochs import epoch_run as epoch_run_module

END = datetime(2026, 11, 22, 10, tzinfo=timezone.utc)


def _manifest(tmp_path, partitions) -> EpochManifest:
    write_inputs(tmp_path / "in", partitions=partitions)
    return EpochManifest("2026-11-22T09:00:00+00:00", END.isoformat(), list_inputs(str(tmp_path / "in")))


def _add_score(batch):
    return batch.append_column("score", pc.multiply(batch["id"], 2))


def _scored(ds, epoch):
    return ds.map_batches(_add_score, batch_format="pyarrow")  # fused with the reader and the writer into one operator


def test_an_operator_fused_with_the_writer_reports_the_rows_and_bytes_it_wrote(ctx, tmp_path):
    record = run_epoch(_manifest(tmp_path, 3), _scored, output_path=str(tmp_path / "out"))
    assert record.status == "succeeded"
    (op,) = [op for op in record.metrics["operators"] if "Write" in op["name"]]
    summary = record.summary()
    assert op["rows"] == summary["rows"] == 300  # was 0: a writer emits files, not blocks
    assert op["bytes"] == summary["bytes"] > 0
    assert op["files"] == sum(len(p.files) for p in record.partitions) >= 3
    assert op["tasks"] >= 3 and op["tasks_rerun"] == 0


def test_a_task_counts_once_however_often_it_succeeded_and_files_count_as_output():
    stats = OpStats("Map->WriteParquet")
    result = TaskResult("p00000", [], 0.5, 0, 0,
                        files=[StagedFile("a.parquet", 70, 1000, []), StagedFile("b.parquet", 30, 500, [])])
    stats.task_done(result)
    stats.task_done(result)  # the same task again (rerun): its output is not counted twice
    assert (stats.tasks_done, stats.tasks_rerun, stats.rows_out, stats.bytes_out, stats.files_out) == (1, 1, 100,
                                                                                                        1500, 2)
    assert stats.work_s == 1.0  # the rerun's work was done, though


def test_each_commit_logs_k_of_n_partitions_committed(ctx, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="airflow_streambatch.epochs"):
        run_epoch(_manifest(tmp_path, 3), _scored, output_path=str(tmp_path / "out"))
    lines = [r.getMessage() for r in caplog.records if "partitions committed" in r.getMessage()]
    assert sorted(line.split(": ", 1)[1].split(" (")[0] for line in lines) == [
        f"{k} of 3 partitions committed" for k in (1, 2, 3)]


def test_the_durable_record_is_snapshotted_at_start_and_end_and_each_commit_appends_one_line(ctx, tmp_path,
                                                                                            monkeypatch):
    saves, appends, progress = [], [], []
    real_save, real_append = EpochCheckpoint.save, EpochCheckpoint.append
    monkeypatch.setattr(EpochCheckpoint, "save", lambda self, rec: (saves.append(rec.status), real_save(self, rec)))
    monkeypatch.setattr(EpochCheckpoint, "append",
                        lambda self, rec, st: (appends.append(st.index), real_append(self, rec, st))[1])
    monkeypatch.setattr(epoch_run_module, "PROGRESS_INTERVAL_S", 0.0)  # the task state store after every commit
    record = run_epoch(_manifest(tmp_path, 8), _scored, output_path=str(tmp_path / "out"),
                       on_progress=lambda r: progress.append(r.status))
    assert record.status == "succeeded" and len(record.by_state("committed")) == 8
    assert saves == ["running", "succeeded"]  # was one more per commit: 10 writes of a growing record
    assert sorted(appends) == list(range(8)) and progress == ["running"] * 8
    assert not (tmp_path / "out" / "_epoch.log").exists()  # the final snapshot absorbed the journal
    on_disk = EpochCheckpoint(str(tmp_path / "out")).load()
    assert on_disk.to_dict() == record.to_dict()  # the final record holds every partition all the same
    assert all(p.state == "committed" and p.rows == 100 and p.this_try for p in on_disk.partitions)

    # a filesystem that cannot append (S3, GCS): snapshots instead, at most every PROGRESS_INTERVAL_S
    saves.clear()
    monkeypatch.setattr(EpochCheckpoint, "append", lambda self, rec, st: False)
    monkeypatch.setattr(epoch_run_module, "PROGRESS_INTERVAL_S", 3600.0)
    (tmp_path / "second").mkdir()
    run_epoch(_manifest(tmp_path / "second", 3), _scored, output_path=str(tmp_path / "second" / "out"))
    assert saves == ["running", "succeeded"]
    saves.clear()
    monkeypatch.setattr(epoch_run_module, "PROGRESS_INTERVAL_S", 0.0)
    (tmp_path / "third").mkdir()
    run_epoch(_manifest(tmp_path / "third", 3), _scored, output_path=str(tmp_path / "third" / "out"))
    assert saves == ["running"] * 4 + ["succeeded"]


def test_the_task_state_summary_holds_counts_and_the_first_failed_partitions_only():
    from airflow_streambatch.epochs.checkpoint import EpochRecord, PartitionStatus
    from airflow_streambatch.operators.streambatch import StreamBatchOperator

    manifest = EpochManifest("a", "b", [])
    record = EpochRecord.start(manifest, "/out")
    record.partitions = [PartitionStatus(i, f"/in/{i}", "committed", rows=10, bytes=5) for i in range(5000)]
    record.partitions[7] = PartitionStatus(7, "/in/7", "failed", error="x" * 10_000, traceback="t" * 10_000)
    summary = StreamBatchOperator.progress_summary(record)
    assert summary["partitions"] == 5000 and summary["committed"] == 4999 and summary["rows"] == 49990
    assert summary["failed"] == 1 and summary["failed_left_out"] == 0
    (failed,) = summary["failed_partitions"]
    assert failed["index"] == 7 and len(failed["error"]) == 300 and "traceback" not in failed
    assert summary["record_uri"] == "file:///out/_epoch.json"
    assert len(str(summary)) < 1500
