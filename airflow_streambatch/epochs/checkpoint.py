"""The epoch checkpoint: which of an epoch's partitions are committed, kept where it lasts.

Three copies with three jobs:

* the engine's commit records (``<output>/p<partition>/_commit.json``) are the
  authority: a partition is done iff its record exists, whatever else says;
* the durable epoch record (``<output>/_epoch.json``, this module) freezes the
  manifest the commits were computed from and says what became of every partition,
  so a clear resumes correctly even where Airflow dropped the task's state, and a
  rerun over changed inputs is refused instead of mixing two versions of the data;
* the Task State Store holds a bounded summary for the UI and logs (`epochs.summary`).

The record is a snapshot plus a journal, so a commit costs O(1) however many
partitions the epoch has: ``_epoch.json`` is written whole only when a run starts,
ends or stops (and, on filesystems that cannot append, at most every few seconds),
and in between each commit appends one JSON line to ``<output>/_epoch.log``. `load`
replays the lines of the snapshot's try over it; a line cut short by a killed driver
is skipped (its partition's commit record still says it is done, and the next try
reads those). Each snapshot deletes the journal it has absorbed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field, fields

import pyarrow.fs as pafs

from airflow_streambatch.engine.output.commit import CommitRecord, PartitionCommitter
from airflow_streambatch.engine.output.lease import WriteLease
from airflow_streambatch.engine.output.protocols import protocol_for
from airflow_streambatch.engine.errors import PartitionFailure
from airflow_streambatch.engine.filesystems import resolve
from airflow_streambatch.epochs.manifest import EpochManifest
from airflow_streambatch.epochs.states import EpochState, PartitionState

log = logging.getLogger("airflow_streambatch.epochs")

RECORD_NAME = "_epoch.json"
JOURNAL_NAME = "_epoch.log"  # one JSON line per partition committed since the snapshot
TRACEBACK_CHARS = 4000  # the record is JSON read by people and tools; keep tracebacks' tails


class EpochChangedError(ValueError):
    """The inputs differ from the manifest that the committed partitions were computed from."""


@dataclass
class PartitionStatus:
    """One input partition of the epoch: committed (by this try or an earlier one) or failed."""

    index: int
    path: str
    state: PartitionState  # a plain string read from a record is made the member of that name
    rows: int = 0
    bytes: int = 0
    files: list[str] = field(default_factory=list)
    run_id: str | None = None  # the engine run that committed it
    this_try: bool = False  # committed by the try that wrote this record
    operator: str | None = None  # where it failed
    error: str | None = None
    traceback: str | None = None
    quarantined: int = 0  # rows its functions failed on, committed beside its files (on_row_error="quarantine")

    def __post_init__(self):
        self.state = PartitionState(self.state)  # records on disk hold the state as its string

    @classmethod
    def committed(cls, index: int, record: CommitRecord, this_try: bool) -> PartitionStatus:
        return cls(index, record.label, PartitionState.COMMITTED, record.rows, record.bytes, list(record.files),
                   record.run_id, this_try, quarantined=record.quarantined_rows)

    @classmethod
    def failed(cls, index: int, failure: PartitionFailure) -> PartitionStatus:
        return cls(index, failure.label, PartitionState.FAILED, operator=failure.operator, error=failure.error,
                   traceback=failure.traceback[-TRACEBACK_CHARS:] or None)

    def to_dict(self) -> dict:
        """The JSON form (the fields by name; `dataclasses.asdict` is 7x slower at 20,000 partitions)."""
        return {**self.__dict__, "state": str(self.state), "files": list(self.files)}


@dataclass
class EpochRecord:
    """An epoch's manifest, the state of each of its partitions, and the run's metrics."""

    epoch: dict  # EpochManifest.to_dict()
    fingerprint: str
    output_path: str
    status: EpochState = EpochState.RUNNING
    reason: str | None = None  # why a run stopped before its partitions were done (interrupted, error)
    partitions: list[PartitionStatus] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    spark_ui_url: str | None = None
    tries: int = 0  # runs of the epoch that started on this output (retries and clears included)
    table: str | None = None  # "delta table s3://..." when the rows go to a table (the record is beside it)
    updated_at: float = field(default_factory=time.time)

    def __post_init__(self):
        self.status = EpochState(self.status)  # records on disk hold the status as its string

    @classmethod
    def start(cls, manifest: EpochManifest, output_path: str) -> EpochRecord:
        pending = [PartitionStatus(i, p.path, PartitionState.PENDING) for i, p in enumerate(manifest.partitions)]
        return cls(manifest.to_dict(), manifest.fingerprint, output_path, partitions=pending)

    def by_state(self, state: PartitionState) -> list[PartitionStatus]:
        return [p for p in self.partitions if p.state == state]

    def counts(self) -> dict:
        """Partitions by state, with the committed ones' rows and bytes: one pass over the partitions."""
        counts = dict.fromkeys((*PartitionState, "committed_this_try", "rows", "bytes", "quarantined"), 0)
        for p in self.partitions:
            counts[p.state] += 1
            if p.state == PartitionState.COMMITTED:
                counts["committed_this_try"] += p.this_try
                counts["rows"] += p.rows
                counts["bytes"] += p.bytes
                counts["quarantined"] += p.quarantined
        return {str(key): n for key, n in counts.items()}  # plain-string keys: the counts go into XCom as they are

    def summary(self) -> dict:
        """Small enough for an asset event's extra and a log line."""
        c = self.counts()
        return {
            "interval_start": self.epoch["interval_start"], "interval_end": self.epoch["interval_end"],
            "fingerprint": self.fingerprint, "status": str(self.status), "reason": self.reason,
            "output_path": self.output_path, "table": self.table,
            "partitions": len(self.partitions), "committed": c["committed"],
            "committed_this_try": c["committed_this_try"], "failed": c["failed"],
            "rows": c["rows"], "bytes": c["bytes"], "quarantined": c["quarantined"],
        }

    def to_dict(self) -> dict:
        """The JSON of ``_epoch.json``: every field, partitions as dicts (shares ``epoch`` and ``metrics``)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["status"] = str(self.status)  # a plain string, as records have always held it
        data["partitions"] = [p.to_dict() for p in self.partitions]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> EpochRecord:
        data = dict(data)
        data["partitions"] = [PartitionStatus(**p) for p in data.get("partitions", [])]
        return cls(**data)

    def apply(self, entry: dict) -> bool:
        """One journal line over this record: the partition it names takes its state. False when the
        line is not of this record's try, or names no partition of it (a journal it did not write)."""
        if entry.get("try") != self.tries:
            return False
        status = PartitionStatus(**{k: v for k, v in entry.items() if k not in ("try", "at")})
        if not 0 <= status.index < len(self.partitions):
            return False
        self.partitions[status.index] = status
        return True


def as_uri(path: str) -> str:
    """A path as a URI for XCom pointers: local paths become ``file://`` URIs, others stay as they are."""
    return path if "://" in path else f"file://{os.path.abspath(path)}"


def record_uri(output_path: str) -> str:
    """The URI of the epoch record of ``output_path`` (no filesystem is touched)."""
    return as_uri(f"{output_path.rstrip('/')}/{RECORD_NAME}")


class EpochCheckpoint:
    """Reads and writes the durable epoch record next to an epoch's output: snapshot plus journal."""

    def __init__(self, output_path: str, lease: WriteLease | None = None):
        self.output_path = output_path.rstrip("/")
        self.lease = lease  # the output's write lease, held by the run that writes (None: read only)
        self.fs, root = resolve(self.output_path)
        self.root = root.rstrip("/")
        self.path = f"{self.root}/{RECORD_NAME}"
        self.journal_path = f"{self.root}/{JOURNAL_NAME}"
        self.can_append = True  # False once the filesystem refused an append (object stores): snapshots only

    @property
    def uri(self) -> str:
        """Where the record is, as a URI (what the bounded XCom summary points to)."""
        return record_uri(self.output_path)

    def load(self) -> EpochRecord | None:
        """The last snapshot with the journal lines of its try replayed over it (None if none)."""
        if self.fs.get_file_info(self.path).type == pafs.FileType.NotFound:
            return None
        with self.fs.open_input_stream(self.path) as f:
            record = EpochRecord.from_dict(json.loads(f.read()))
        self.replay(record)
        return record

    def replay(self, record: EpochRecord) -> int:
        """Apply the journal to ``record``; the lines applied. A line that does not parse (the last
        one, cut short by a killed driver) is skipped with a warning: the commit records decide."""
        try:
            with self.fs.open_input_stream(self.journal_path) as f:
                data = f.read()
        except FileNotFoundError:
            return 0
        applied = skipped = 0
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                applied += record.apply(entry)
            except (ValueError, TypeError):
                skipped += 1
        if skipped:
            log.warning("%s: skipped %d unreadable line(s) of %s (cut short when a driver was killed); the "
                        "commit records under %s decide what the next try reruns", self.output_path, skipped,
                        JOURNAL_NAME, self.output_path)
        return applied

    def append(self, record: EpochRecord, status: PartitionStatus) -> bool:
        """Journal one partition's new state with one append of one line; False where the filesystem
        cannot append (the caller snapshots instead)."""
        if not self.can_append:
            return False
        line = json.dumps({"try": record.tries, "at": round(time.time(), 3), **status.to_dict()},
                          separators=(",", ":")) + "\n"
        try:
            with self.fs.open_append_stream(self.journal_path) as out:
                out.write(line.encode())
        except NotImplementedError:  # pyarrow's S3 and GCS filesystems: objects cannot grow
            self.can_append = False
            return False
        return True

    def save(self, record: EpochRecord) -> None:
        """Snapshot the whole record (a killed driver leaves the old snapshot or the new one:
        `RenameCommit.write_whole`, or one object on object stores), then drop the journal it
        absorbed (a journal left by a kill in between is of the same try and says nothing the
        snapshot does not)."""
        record.updated_at = time.time()
        self.fs.create_dir(self.root, recursive=True)
        # compact: the C encoder, 6x faster than indented
        protocol_for(self.fs).write_whole(self.path, json.dumps(record.to_dict(), separators=(",", ":")).encode())
        self._drop_journal()

    def _drop_journal(self) -> None:
        try:
            self.fs.delete_file(self.journal_path)
        except FileNotFoundError:
            pass

    def wipe(self) -> None:
        """Delete this epoch's committed partitions, their records, staging and the epoch record (a full
        recompute). Nothing else under the output path is touched: it may be a root that holds other
        epochs' directories or files a user put there."""
        PartitionCommitter(self.output_path, run_id="wipe", lease=self.lease).wipe()
        selector = pafs.FileSelector(self.root, allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File and info.base_name.startswith((RECORD_NAME, JOURNAL_NAME)):
                self.fs.delete_file(info.path)  # with the snapshot's .tmp files

    def validate(self, manifest: EpochManifest, full_recompute: bool = False) -> EpochRecord | None:
        """The previous record of this epoch, if its commits may be kept (None after a wipe).

        Raises `EpochChangedError` when partitions were committed from different inputs. The interval
        bounds do not count: a manual run of an epoch that already ran over the same inputs keeps its commits.
        """
        previous = self.load()
        if full_recompute:
            self.wipe()
            return None
        # recomputed from the frozen manifest, so records written before the fingerprint covered the inputs
        # only (it used to cover the interval bounds too) are compared by their inputs as well
        frozen = EpochManifest.from_dict(previous.epoch) if previous is not None else None
        if frozen is not None and frozen.fingerprint != manifest.fingerprint:
            done = len(previous.by_state(PartitionState.COMMITTED))
            files = {(p.path, p.size, p.mtime, p.etag) for p in frozen.partitions}
            if files == {(p.path, p.size, p.mtime, p.etag) for p in manifest.partitions}:
                why = ("the same files, split into partitions differently: max_partition_bytes changed since "
                       "the epoch started. Keep the setting it started with, or")
            else:
                why = "files were added, removed or rewritten since. Restore the inputs, or"
            raise EpochChangedError(
                f"{self.output_path} holds {done} partition(s) committed from epoch inputs with fingerprint "
                f"{frozen.fingerprint}, but this run's manifest has fingerprint {manifest.fingerprint} ({why} set "
                "full_recompute=True on the operator to recompute the whole epoch). Mixing both would duplicate "
                "or lose rows."
            )
        return previous


INTERRUPTIONS = {  # by class name: the epochs layer imports nothing from Airflow
    "AirflowTaskTimeout": "timeout (the task's execution_timeout passed)",
    "AirflowTaskTerminated": "terminated (SIGTERM: the task was marked failed, cleared or its worker stopped)",
    "SystemExit": "terminated (the process was asked to exit, e.g. SIGTERM)",
    "KeyboardInterrupt": "interrupted (SIGINT)",
}


def stop_reason(exc: BaseException) -> str:
    """Why a run stopped, for the epoch record: an interruption and its kind, or the error."""
    kind = INTERRUPTIONS.get(type(exc).__name__)
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"interrupted: {kind}: {detail}" if kind else f"error: {detail}"
