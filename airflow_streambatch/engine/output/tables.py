"""Lakehouse tables (Delta, Iceberg) as write targets: partitions committed in table
transactions, many per transaction, each exactly once by its idempotence marker.

Why a table needs no rename, no staging and no lease: its data files are invisible
until a transaction of the table's log lists them, and the log commits with optimistic
concurrency. Sink tasks write Parquet files straight into the table's data location,
named by run and task (`worker/sinks.write_task_output` with ``staged=False``). When a
partition's tasks are done, its files wait in the driver; every
``DataContext.table_commit_interval_s`` (and when the run ends) the waiting partitions
are committed in ONE transaction (one transaction per partition floods the table's log:
20,000 partitions would be 20,000 versions to read on every load).

Each transaction carries one marker per partition it commits, named by the write's
*key* and the partition (``streambatch:<key>:p00003``): a Delta application transaction
(``txn``), an Iceberg snapshot-summary property. Before committing, the markers are read
and partitions already committed are dropped from the batch (their files deleted), so a
retry, a resume, a Clear or a concurrent writer of the same key never commits a
partition twice. A commit whose outcome is unknown (a timeout, a conflict, a driver
killed during it) is settled by reading the markers again, never by committing blindly:
a marker present means committed. The key is the epoch for the Airflow operator
(``<dag>/<task>/<interval>``), ``default`` for ``write_*(mode="resume")`` and the run's
id for appends.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import pyarrow.fs as pafs

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.filesystems import resolve
from airflow_streambatch.engine.output.commit import CommitRecord, SchemaGuard
from airflow_streambatch.engine.protocol.staging import StagedFile

log = logging.getLogger("airflow_streambatch.engine.progress")

COMMIT_ATTEMPTS = 10  # a conflicting transaction is retried (after re-reading the markers) this often


def require(module: str, what: str):
    """Import the table library ``module``, or say which extra installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{what} needs the {module} package: pip install 'airflow-streambatch[tables]'") from exc


def marker(key: str, partition: int) -> str:
    return f"streambatch:{key}:p{partition:05d}"


class AlreadyCommitted(Exception):
    """Partitions of a batch are committed on the table version a commit was about to build on."""


def check_not_committed(markers: dict, batch: list) -> None:
    """Raise `AlreadyCommitted` if a marker of the batch is on the table the commit builds on: a format
    checks this on the very version it commits against, which the table's optimistic concurrency then
    guards, so two writers never both commit a partition."""
    done = sorted(p.record.partition for p in batch if p.record.partition in markers)
    if done:
        raise AlreadyCommitted(f"partitions {done} are committed already")


@dataclass
class Pending:
    record: CommitRecord
    files: list[StagedFile]


class TableFormat:
    """What a table format provides (`delta.DeltaFormat`, `iceberg.IcebergFormat`)."""

    name = "table"
    uri = ""  # the table's location, for messages and the epoch record beside it

    def data_path(self) -> str:
        """Where sink tasks write data files (a URI or local path)."""
        raise NotImplementedError

    def markers(self, key: str) -> dict[int, CommitRecord]:
        """The partitions committed under ``key``, with the record each transaction carried."""
        raise NotImplementedError

    def commit(self, key: str, batch: list[Pending]) -> None:
        """Add the batch's files and markers in one transaction (creating the table if needed), built on
        a table version whose markers it checked (`check_not_committed`), failing if another commit
        landed since: never rebased blindly."""
        raise NotImplementedError

    def truncate(self) -> None:
        """Remove every row in one transaction (``mode="overwrite"``); the history keeps them."""
        raise NotImplementedError

    def has_rows(self) -> bool:
        raise NotImplementedError


class TableCommitter:
    """The partition tracker's committer for a table (the directory one is `commit.PartitionCommitter`)."""

    tag = None

    def __init__(self, table: TableFormat, key: str, run_id: str, interval_s: float):
        self.table, self.key, self.run_id, self.interval_s = table, key, run_id, interval_s
        self.path = table.data_path()
        self.fs, root = resolve(self.path.rstrip("/"))
        self.root = root.rstrip("/")
        self.schemas = SchemaGuard(table.uri)
        self.waiting: list[Pending] = []
        self.since = time.monotonic()

    # -- what is committed ------------------------------------------------------------
    def committed(self) -> dict[int, CommitRecord]:
        return self.table.markers(self.key)

    def scan(self) -> dict[int, CommitRecord]:
        return self.committed()

    def set_reference_schema(self, records: dict) -> None:
        self.schemas.set_reference(records)

    # -- committing -------------------------------------------------------------------
    def claim_staging(self) -> None:
        self.fs.create_dir(self.root, recursive=True)

    def commit(self, partition: int, label: str, files: list[StagedFile], inputs: str = "",
               quarantined: list[StagedFile] = ()) -> list[CommitRecord]:
        """Hold the partition for the next transaction; the records committed now (a batch, when due)."""
        if quarantined:  # refused when the write is planned (`plan/row_errors.py`); never dropped silently
            raise ValueError(f"partition {partition} ({label}) set rows aside, which a table write cannot keep")
        schema = self.schemas.check(partition, label, files)
        record = CommitRecord(partition=partition, label=label, files=[self._relative(f.path) for f in files],
                              rows=sum(f.rows for f in files), bytes=sum(f.bytes for f in files),
                              run_id=self.run_id, inputs=inputs, schema=schema)
        if not self.waiting:
            self.since = time.monotonic()  # the batch's age counts from its first partition
        self.waiting.append(Pending(record, list(files)))
        if time.monotonic() - self.since < self.interval_s:
            return []
        return self.flush()

    def flush(self) -> list[CommitRecord]:
        """Commit the waiting partitions in one transaction; the records that landed."""
        batch, self.waiting = self.waiting, []
        landed: list[CommitRecord] = []
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            done = self.table.markers(self.key) if batch else {}
            for pending in [p for p in batch if p.record.partition in done]:
                if done[pending.record.partition].run_id == self.run_id:  # an attempt whose answer was lost
                    landed.append(pending.record)
                    continue
                log.warning("partition %d of %s was committed by another writer (key %s); this run's files of it "
                            "are dropped", pending.record.partition, self.table.uri, self.key)
                self._delete(pending.files)
            batch = [p for p in batch if p.record.partition not in done]
            if not batch:
                return landed
            try:
                self.table.commit(self.key, batch)
                return landed + [p.record for p in batch]
            except Exception as exc:  # noqa: BLE001 - settled by the markers, whatever the failure was
                if attempt == COMMIT_ATTEMPTS:
                    raise
                log.warning("commit of %d partition(s) to %s failed or its outcome is unknown (%s: %s); reading "
                            "its markers to settle it", len(batch), self.table.uri, type(exc).__name__, exc)
                time.sleep(0.1 * attempt * (1 + random.random()))  # writers that collided do not collide again
        return landed

    def finish(self, complete: bool) -> None:
        """Nothing to record: the markers say what is committed."""

    def cleanup(self) -> None:
        """Delete this run's data files that no transaction lists (failed or stopped partitions,
        a batch whose commit failed): they are named by the run, and invisible to readers."""
        self.waiting = []
        prefix = f"part-{self.run_id}-"
        committed = {name.rsplit("/", 1)[-1] for rec in self.table.markers(self.key).values() for name in rec.files}
        for info in self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True)):
            if info.base_name.startswith(prefix) and info.base_name not in committed:
                self.fs.delete_file(info.path)

    def _relative(self, path: str) -> str:
        return path[len(self.root) + 1:] if path.startswith(self.root + "/") else path

    def _delete(self, files: list[StagedFile]) -> None:
        for f in files:
            try:
                self.fs.delete_file(f.path)
            except FileNotFoundError:
                pass


class TableTarget:
    """A table opened for writing: what `target.OutputTarget` is for a directory.

    :param key: the write's idempotence key (the epoch, for the Airflow operator); by
        default ``"default"`` for ``mode="resume"`` and the run's id otherwise.
    """

    def __init__(self, table: TableFormat, key: str | None = None):
        self.table, self.key = table, key
        self.path = table.uri

    def committer(self, run_id: str, mode: str | None = "resume") -> TableCommitter:
        key = self.key or ("default" if mode == "resume" else run_id)
        return TableCommitter(self.table, key, run_id, DataContext.get_current().table_commit_interval_s)

    def prepare(self, mode: str | None) -> dict[int, CommitRecord] | None:
        """``mode`` on a table: ``append`` and ``resume`` add, ``overwrite`` first removes every row in
        one transaction, ``error`` refuses a table with rows, ``ignore`` does nothing to one."""
        if mode in ("error", "ignore") and self.table.has_rows():
            if mode == "ignore":
                return {}
            raise FileExistsError(f"{self.table.name} table {self.path} already holds rows: choose mode='append', "
                                  "'resume', 'overwrite' or 'ignore'")
        if mode == "overwrite":
            self.table.truncate()
        return None

    def close(self) -> None:
        """A table needs no lease: its log's optimistic concurrency and the markers keep writers apart."""
