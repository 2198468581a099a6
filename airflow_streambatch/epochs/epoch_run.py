"""One try of one epoch, as an object: `EpochRun` with ``start``, ``commit``, ``fail`` and ``finish``.

Why an object: a try's bookkeeping (its durable record, how many partitions are
committed, when the Task State Store and the record's snapshot were last refreshed, the
time the bookkeeping itself took) lives between the engine's commit callbacks. Kept as
a dict updated from a closure inside a ten-argument function, none of it could be
named, read or tested on its own; here each step of the try is a method and each piece
of state an attribute, and `runner.run_job` only sequences them around the engine's write.

A run exists only under the output's write lease (`OutputTarget.open`), so the record
it writes is the only one being written for that epoch.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from airflow_streambatch.engine.dataset import Dataset
from airflow_streambatch.engine.execution.partitions import WriteResult
from airflow_streambatch.engine.output.commit import CommitRecord
from airflow_streambatch.engine.output.target import OutputTarget
from airflow_streambatch.epochs.checkpoint import EpochCheckpoint, EpochRecord, PartitionStatus, stop_reason
from airflow_streambatch.epochs.job import EpochJob
from airflow_streambatch.epochs.outputs import EpochOutput
from airflow_streambatch.epochs.states import EpochState, PartitionState

log = logging.getLogger("airflow_streambatch.epochs")

# during a run, on_progress (the Task State Store) gets the record at most this often, and so does the
# snapshot ``_epoch.json`` on filesystems that cannot append to its journal (object stores)
PROGRESS_INTERVAL_S = 2.0

OnProgress = Callable[[EpochRecord], None]


class EpochRun:
    """The record of one try of ``job``'s epoch under ``target``'s lease, kept up to date as partitions commit.

    ``on_progress`` (the operator's Task State Store) gets the record at most every
    `PROGRESS_INTERVAL_S` seconds during the run, and once more when it stops.
    """

    def __init__(self, job: EpochJob, output: EpochOutput, target: OutputTarget, *,
                 on_progress: OnProgress | None = None, spark_ui_url: str | None = None):
        self.job, self.manifest, self.output, self.target = job, job.manifest, output, target
        self.checkpoint = EpochCheckpoint(target.path, target.lease)
        self.on_progress = on_progress
        self.spark_ui_url = spark_ui_url
        self.record: EpochRecord | None = None  # this try's, once `start` wrote it
        self.committed = 0  # partitions committed, by this try or earlier ones
        self.bookkeeping_s = 0.0  # the epoch layer's own time within the engine's run (W9 reports it)
        self._published = self._saved = time.monotonic()

    @property
    def interval(self) -> str:
        return f"{self.manifest.interval_start}..{self.manifest.interval_end}"

    def start(self) -> EpochRecord | None:
        """Check the previous try's record against the manifest, then write this try's. Returns the
        finished record when nothing is left to run (an empty epoch, or one whose partitions are all
        committed and whose record says so), else None: run the pipeline, committing through `commit`."""
        manifest = self.manifest
        previous = self.checkpoint.validate(manifest, self.job.full_recompute)
        if previous is not None and previous.status == EpochState.RUNNING:  # we hold the lease: it is not
            log.warning("try %d of epoch %s stopped without recording why (its record still says running): its "
                        "driver was killed (SIGKILL, the out-of-memory killer, a lost host); resuming from its "
                        "commits", previous.tries, self.interval)
        record = self.record = EpochRecord.start(manifest, self.target.path)  # beside a table's, not in it
        record.table = self.output.describe() if self.output.is_table else None
        record.tries = (previous.tries if previous else 0) + 1
        if not manifest.partitions:  # a quiet interval: an empty epoch is done, not an error
            log.warning("epoch %s has no input files; committing it empty", self.interval)
            record.status = EpochState.SUCCEEDED
            self.checkpoint.save(record)
            return record
        committed = self.output.committed(self.target, manifest)
        if (previous is not None and previous.status == EpochState.SUCCEEDED
                and len(committed) == len(manifest.partitions)):
            log.info("epoch %s already committed all %d partitions to %s; nothing to rerun (set "
                     "full_recompute=True to recompute it)", self.interval, len(committed), self.output.describe())
            for status in previous.partitions:
                status.this_try = False
            return previous
        manifest.verify_unchanged()

        record.spark_ui_url = self.spark_ui_url
        for index, rec in committed.items():
            if index < len(record.partitions):
                record.partitions[index] = PartitionStatus.committed(index, rec, this_try=False)
        self.checkpoint.save(record)
        log.info("epoch %s: %d partitions, %d committed by earlier tries, running the rest into %s", self.interval,
                 len(manifest.partitions), len(committed), self.output.describe())
        self.committed = sum(p.state == PartitionState.COMMITTED for p in record.partitions)
        self._published = self._saved = time.monotonic()
        return None

    def commit(self, rec: CommitRecord) -> None:
        """The engine committed partition ``rec.partition``: one journal line (or, where the filesystem
        cannot append, a snapshot at most every `PROGRESS_INTERVAL_S`), one log line, maybe progress."""
        started = time.perf_counter()
        record = self.record
        if record.partitions[rec.partition].state != PartitionState.COMMITTED:
            self.committed += 1
        status = PartitionStatus.committed(rec.partition, rec, this_try=True)
        record.partitions[rec.partition] = status
        log.info("epoch %s: %d of %d partitions committed (partition %d, %s: %d rows, %d bytes)", self.interval,
                 self.committed, len(record.partitions), rec.partition, rec.label, rec.rows, rec.bytes)
        now = time.monotonic()
        if not self.checkpoint.append(record, status) and now - self._saved >= PROGRESS_INTERVAL_S:
            self.checkpoint.save(record)  # no journal on this filesystem: a snapshot now and then instead
            self._saved = now
        if self.on_progress is not None and now - self._published >= PROGRESS_INTERVAL_S:
            self.on_progress(record)
            self._published = now
        self.bookkeeping_s += time.perf_counter() - started

    def fail(self, exc: BaseException) -> None:
        """Whatever stopped the run (an error, a timeout, SIGTERM) goes into the record: never ``running``."""
        record = self.record
        record.status, record.reason = EpochState.FAILED, stop_reason(exc)
        log.error("epoch %s stopped: %s", self.interval, record.reason)
        self.checkpoint.save(record)
        if self.on_progress is not None:
            with contextlib.suppress(Exception):  # the task state store is for the UI: never mask the cause
                self.on_progress(record)

    def finish(self, result: WriteResult, ds: Dataset) -> EpochRecord:
        """The write ended: its failed partitions, the epoch's state and the run's metrics, saved."""
        record = self.record
        for failure in result.failed:
            record.partitions[failure.partition] = PartitionStatus.failed(failure.partition, failure)
        unfinished = record.by_state(PartitionState.FAILED) or record.by_state(PartitionState.PENDING)
        record.status = EpochState.FAILED if unfinished else EpochState.SUCCEEDED
        record.metrics = run_metrics(ds)
        record.metrics["commit_bookkeeping_s"] = round(self.bookkeeping_s, 4)
        self.checkpoint.save(record)
        return record


def run_metrics(ds: Dataset) -> dict:
    """What the engine's last run of ``ds`` measured, for the record: wall time, memory, each operator."""
    stats = ds.last_run_stats
    if stats is None:
        return {}
    return {
        "wall_s": round(stats.wall_s, 3),
        "peak_buffered_bytes": stats.peak_memory_bytes,
        "spark_jobs": len(stats.launch_log),
        "operators": [
            {"name": op.name, "tasks": op.tasks_done, "tasks_rerun": op.tasks_rerun,
             "tasks_retried": op.tasks_retried, "rows": op.rows_out,
             "bytes": op.bytes_out, "files": op.files_out, "wall_s": round(op.wall_s, 3),
             "task_s": round(op.work_s, 3)}
            for op in stats.ops
        ],
    }
