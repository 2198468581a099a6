"""The epoch checkpoint: which of an epoch's partitions are committed, kept where it lasts.

Three copies with three jobs:

* the engine's commit records (``<output>/p<partition>/_commit.json``) are the
  authority: a partition is done iff its record exists, whatever else says;
* the durable epoch record (``<output>/_epoch.json``, this module) freezes the
  manifest the commits were computed from and summarises every partition, so a
  clear resumes correctly even where Airflow dropped the task's state, and a rerun
  over changed inputs is refused instead of mixing two versions of the data;
* the Task State Store holds the same per-partition summary for the UI and logs
  (the operator writes it through any object with ``get``/``set``).

The record is also the final epoch manifest the operator pushes to XCom.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from airflow_streambatch.engine.execution.commit import CommitRecord, PartitionCommitter
from airflow_streambatch.engine.errors import PartitionFailure
from airflow_streambatch.engine.filesystems import resolve
from airflow_streambatch.epochs.manifest import EpochManifest

RECORD_NAME = "_epoch.json"
TRACEBACK_CHARS = 4000  # XCom and the task state store hold JSON; keep tracebacks' tails


class EpochChangedError(ValueError):
    """The inputs differ from the manifest that the committed partitions were computed from."""


@dataclass
class PartitionStatus:
    """One input partition of the epoch: committed (by this try or an earlier one) or failed."""

    index: int
    path: str
    state: str  # "committed" | "failed" | "pending"
    rows: int = 0
    bytes: int = 0
    files: list[str] = field(default_factory=list)
    run_id: str | None = None  # the engine run that committed it
    this_try: bool = False  # committed by the try that wrote this record
    operator: str | None = None  # where it failed
    error: str | None = None
    traceback: str | None = None

    @classmethod
    def committed(cls, index: int, record: CommitRecord, this_try: bool) -> PartitionStatus:
        return cls(index, record.label, "committed", record.rows, record.bytes, list(record.files), record.run_id,
                   this_try)

    @classmethod
    def failed(cls, index: int, failure: PartitionFailure) -> PartitionStatus:
        return cls(index, failure.label, "failed", operator=failure.operator, error=failure.error,
                   traceback=failure.traceback[-TRACEBACK_CHARS:] or None)


@dataclass
class EpochRecord:
    """An epoch's manifest, the state of each of its partitions, and the run's metrics."""

    epoch: dict  # EpochManifest.to_dict()
    fingerprint: str
    output_path: str
    status: str = "running"  # "running" | "succeeded" | "failed"
    reason: str | None = None  # why a run stopped before its partitions were done (interrupted, error)
    partitions: list[PartitionStatus] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    spark_ui_url: str | None = None
    tries: int = 0  # runs of the epoch that started on this output (retries and clears included)
    updated_at: float = field(default_factory=time.time)

    @classmethod
    def start(cls, manifest: EpochManifest, output_path: str) -> EpochRecord:
        pending = [PartitionStatus(i, p.path, "pending") for i, p in enumerate(manifest.partitions)]
        return cls(manifest.to_dict(), manifest.fingerprint, output_path, partitions=pending)

    def by_state(self, state: str) -> list[PartitionStatus]:
        return [p for p in self.partitions if p.state == state]

    def summary(self) -> dict:
        """Small enough for an asset event's extra and a log line."""
        committed = self.by_state("committed")
        return {
            "interval_start": self.epoch["interval_start"], "interval_end": self.epoch["interval_end"],
            "fingerprint": self.fingerprint, "status": self.status, "reason": self.reason,
            "output_path": self.output_path,
            "partitions": len(self.partitions), "committed": len(committed),
            "committed_this_try": sum(p.this_try for p in committed), "failed": len(self.by_state("failed")),
            "rows": sum(p.rows for p in committed), "bytes": sum(p.bytes for p in committed),
        }

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> EpochRecord:
        data = dict(data)
        data["partitions"] = [PartitionStatus(**p) for p in data.get("partitions", [])]
        return cls(**data)


class EpochCheckpoint:
    """Reads and writes the durable epoch record next to an epoch's output."""

    def __init__(self, output_path: str):
        self.output_path = output_path.rstrip("/")
        self.fs, root = resolve(self.output_path)
        self.root = root.rstrip("/")
        self.path = f"{self.root}/{RECORD_NAME}"

    def load(self) -> EpochRecord | None:
        if self.fs.get_file_info(self.path).type == pafs.FileType.NotFound:
            return None
        with self.fs.open_input_stream(self.path) as f:
            return EpochRecord.from_dict(json.loads(f.read()))

    def save(self, record: EpochRecord) -> None:
        """Write through a temporary name, so a killed driver leaves the old record or the new one."""
        record.updated_at = time.time()
        self.fs.create_dir(self.root, recursive=True)
        tmp = f"{self.path}.{uuid.uuid4().hex[:8]}.tmp"
        with self.fs.open_output_stream(tmp) as out:
            out.write(json.dumps(record.to_dict(), indent=1).encode())
        self.fs.move(tmp, self.path)

    def wipe(self) -> None:
        """Delete this epoch's committed partitions, their records, staging and the epoch record (a full
        recompute). Nothing else under the output path is touched: it may be a root that holds other
        epochs' directories or files a user put there."""
        PartitionCommitter(self.output_path, run_id="wipe").wipe()
        selector = pafs.FileSelector(self.root, allow_not_found=True)
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File and info.base_name.startswith(RECORD_NAME):  # with its .tmp files
                self.fs.delete_file(info.path)

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
        before = EpochManifest.from_dict(previous.epoch).fingerprint if previous is not None else None
        if previous is not None and before != manifest.fingerprint:
            done = len(previous.by_state("committed"))
            raise EpochChangedError(
                f"{self.output_path} holds {done} partition(s) committed from epoch inputs with fingerprint "
                f"{before}, but this run's manifest has fingerprint {manifest.fingerprint} (files were "
                "added, removed or rewritten since). Mixing both would duplicate or lose rows: set "
                "full_recompute=True on the operator to recompute the whole epoch, or restore the inputs."
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
