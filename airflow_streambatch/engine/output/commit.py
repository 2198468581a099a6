"""Exactly-once output: each partition's files are staged, then made visible at once.

A partition is an input partition, or, for a write after ``repartition(n)``, one of its
``n`` output blocks (`partitions.PartitionTracker.relabel_at_barrier`).

Layout under the sink's ``path``::

    _staging/<run id>/_driver                      host and pid of the writing driver
    _staging/<run id>/p00003/part-<task>.parquet   written by sink tasks
    _staging/<run id>/p00003/_commit.json          the commit record, written last
    p00003/part-<task>.parquet                     after the commit: one directory rename
    p00003/_commit.json

How a partition's files become visible depends on the filesystem (`protocols.py`): one
directory rename on POSIX filesystems, a conditionally created record then server-side
copies on object stores. Either way a partition is committed iff
``p<partition>/_commit.json`` exists, a driver killed at any instant never leaves a row
of an uncommitted partition visible, and readers skip ``_``-prefixed paths (Spark,
pyarrow, pandas, and this engine's own readers), so they never see staged files;
``WriteResult.files`` lists exactly the committed ones (`docs/reliability.md`).

Each record names the input it was computed from (``inputs``: a fingerprint of the
read task's files, sizes, modification times and row groups) and the columns it
wrote, so a resumed write refuses stale partitions and a partition whose schema
differs from the committed ones fails instead of committing.

An append to a path that already holds partitions names its directories
``p00003-<run id>``, so each write adds a set of partitions beside the earlier ones;
every other write names them ``p00003``.

One writer at a time: a run commits only while it holds ``<path>/_lease``
(`lease.py`), which the `target.OutputTarget` it was given holds. ``_write.json`` says
whether the last write under the path finished, so that a plain rerun of a failed
write does not silently add a second copy (`target.OutputTarget.prepare`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from airflow_streambatch.engine.filesystems import resolve_in
from airflow_streambatch.engine.output import lease as write_lease
from airflow_streambatch.engine.output.empty_dirs import remove_if_empty
from airflow_streambatch.engine.output.protocols import CommittedElsewhere, CopyCommit, protocol_for
from airflow_streambatch.engine.worker.owner import OWNER_FILE, left_by_dead_driver, owner_mark
from airflow_streambatch.engine.protocol.staging import RECORD, StagedFile, partition_dir, staging_dir

log = logging.getLogger("airflow_streambatch.engine.progress")

_PARTITION_DIR = re.compile(r"^p(\d{5,})(?:-([0-9a-f]+))?$")
WRITE_STATE = "_write.json"  # the last write's run id and whether it finished


class SchemaMismatchError(ValueError):
    """A partition's output columns differ from those of the partitions already committed."""


@dataclass
class CommitRecord:
    partition: int
    label: str
    files: list[str]
    rows: int
    bytes: int
    run_id: str
    inputs: str = ""  # fingerprint of the input the partition was computed from
    schema: list[list[str]] | None = None  # [[column, arrow type], ...]; None for an empty partition
    quarantined: list[str] = field(default_factory=list)  # files of the rows set aside (`worker/row_errors.py`)
    quarantined_rows: int = 0
    committed_at: float = field(default_factory=time.time)


def describe_schema_difference(expected: list[list[str]], found: list[list[str]]) -> str:
    want, got = dict(map(tuple, expected)), dict(map(tuple, found))
    parts = [f"missing {name!r}" for name in want if name not in got]
    parts += [f"extra {name!r} ({got[name]})" for name in got if name not in want]
    parts += [f"{name!r} is {got[name]}, not {want[name]}" for name in want if name in got and got[name] != want[name]]
    return ", ".join(parts) or f"column order {[c for c, _ in found]} instead of {[c for c, _ in expected]}"


class SchemaGuard:
    """Every partition committed to one output has the same columns: the first one's, or those
    of partitions committed earlier (readers of mixed files fail or drop rows)."""

    def __init__(self, path: str):
        self.path = path
        self.reference: tuple[int, list[list[str]]] | None = None  # (partition, schema) all commits must match

    def set_reference(self, records: dict) -> None:
        """Partitions committed earlier fix the schema this write must match."""
        for rec in sorted(records.values(), key=lambda r: r.partition):
            if rec.schema is not None:
                self.reference = (rec.partition, rec.schema)
                return

    def check(self, partition: int, label: str, files: list[StagedFile]) -> list[list[str]] | None:
        """The partition's schema (None when it has no rows); `SchemaMismatchError` if it differs."""
        schemas = [f.schema for f in files if f.rows]
        schema = schemas[0] if schemas else None
        for other in schemas[1:]:
            if other != schema:
                raise SchemaMismatchError(f"partition {partition} ({label}) wrote files of different schemas: "
                                          f"{describe_schema_difference(schema, other)}")
        if schema is None:
            return None
        if self.reference is None:
            self.reference = (partition, schema)
        elif schema != self.reference[1]:
            raise SchemaMismatchError(
                f"partition {partition} ({label}) writes columns that differ from committed partition "
                f"{self.reference[0]}: {describe_schema_difference(self.reference[1], schema)}. Readers of "
                f"{self.path} would fail or drop rows; make the pipeline return the same columns and types "
                "for every input (cast them in a map_batches step)"
            )
        return schema


def check_resumable(path: str, partition: int, record: CommitRecord, task) -> None:
    """A resumed write may skip ``partition`` only if its record came from the same input.

    ``task`` is the `ReadTask` this run would run for the partition. Raises ValueError
    naming what changed and how to recompute, never keeps stale output silently.
    """
    how = ("Write with mode='overwrite' to recompute every partition, or to a new path; "
           "keep the inputs and override_num_blocks as they were to resume")
    if record.label != task.label:
        raise ValueError(f"{path} holds partition {partition} committed from {record.label!r}, but this run's "
                         f"partition {partition} reads {task.label!r}: the input partitioning changed. {how}.")
    if record.inputs and task.identity and record.inputs != task.identity:
        raise ValueError(f"{path} holds partition {partition} committed from {record.label!r}, which has changed "
                         f"since (size, modification time or row groups differ): its committed rows are stale. "
                         f"{how}.")


class PartitionCommitter:
    """Stages, commits and lists the per-partition output of one sink path.

    :param tag: ``None`` for writes that own the path's ``p<partition>`` directories,
        a write's id for appends (directories ``p<partition>-<tag>``).
    :param lease: the path's write lease, held by the caller (`target.OutputTarget`);
        None for a committer that only reads what is committed, or wipes it.
    :param filesystem: the `pyarrow.fs.FileSystem` the path is in (Ray Data's ``filesystem=``),
        None for the one the path's scheme names.
    """

    def __init__(self, path: str, run_id: str, tag: str | None = None,
                 lease: write_lease.WriteLease | None = None, filesystem: pafs.FileSystem | None = None):
        self.path = path.rstrip("/")
        self.run_id = run_id
        self.tag = tag
        self.fs, root = resolve_in(self.path, filesystem)
        self.root = root.rstrip("/")
        self.protocol = protocol_for(self.fs)
        self.schemas = SchemaGuard(self.path)
        self.lease = lease
        self._in_flight: dict[str, tuple[str, list[str]]] = {}  # staged dir name -> (final dir, file names)

    def staging_dir(self, partition: int) -> str:
        """Where sink tasks write this run's files of ``partition`` (inside the filesystem)."""
        return staging_dir(self.root, self.run_id, partition)

    # -- reading what is there ------------------------------------------------------
    def scan(self) -> dict[str, CommitRecord]:
        """Every committed partition directory under the path (any write), by directory name."""
        selector = pafs.FileSelector(self.root, allow_not_found=True)
        found = {}
        for info in self.fs.get_file_info(selector):
            if info.type != pafs.FileType.Directory or not _PARTITION_DIR.match(info.base_name):
                continue
            record = self._read_record(f"{info.path}/{RECORD}")
            if record is not None:
                found[info.base_name] = record
        return found

    def committed(self) -> dict[int, CommitRecord]:
        """Committed partitions of this write's kind (``p<partition>``, or ``-<tag>`` for appends)."""
        return {rec.partition: rec for name, rec in self.scan().items() if name == partition_dir(rec.partition,
                                                                                                   self.tag)}

    def foreign_entries(self) -> list[str]:
        """Visible entries under the path that no write of this engine made (never deleted)."""
        selector = pafs.FileSelector(self.root, allow_not_found=True)
        ours = set(self.scan())
        return sorted(info.base_name for info in self.fs.get_file_info(selector)
                      if not info.base_name.startswith(("_", ".")) and info.base_name not in ours)

    def _read_record(self, path: str) -> CommitRecord | None:
        try:
            with self.fs.open_input_stream(path) as f:
                return CommitRecord(**json.loads(f.read()))
        except FileNotFoundError:
            return None

    def set_reference_schema(self, records: dict) -> None:
        self.schemas.set_reference(records)

    # -- committing -------------------------------------------------------------------
    def claim_staging(self) -> None:
        """Settle what dead runs left (finish commits a killed driver left half copied, remove
        their staging), then create this run's staging directory, marked with the driver that
        owns it, and record that a write is under way (``_write.json``). The caller holds the lease."""
        if self.lease is None:
            raise RuntimeError(f"a write to {self.path} needs its write lease: open it with OutputTarget.open")
        self.lease.set_run_id(self.run_id)
        self._sweep_dead_staging()
        run_staging = f"{self.root}/_staging/{self.run_id}"
        self.fs.create_dir(run_staging, recursive=True)
        # whole or not at all: a sweep that read half a pid could take a live run's staging for a dead one's
        self.protocol.write_whole(f"{run_staging}/{OWNER_FILE}", owner_mark().encode())
        self._write_state("running")

    def finish(self, complete: bool) -> None:
        """Record whether this write committed every partition (``_write.json``)."""
        self._write_state("finished" if complete else "unfinished")

    def last_write(self) -> dict | None:
        """The state of the last write under the path (run id, tag, finished or not), None if none."""
        try:
            with self.fs.open_input_stream(f"{self.root}/{WRITE_STATE}") as f:
                return json.loads(f.read())
        except (FileNotFoundError, ValueError):
            return None

    def _write_state(self, state: str) -> None:
        data = {"run_id": self.run_id, "tag": self.tag, "state": state, "at": time.time()}
        self.protocol.write_whole(f"{self.root}/{WRITE_STATE}", json.dumps(data).encode())

    def commit(self, partition: int, label: str, files: list[StagedFile], inputs: str = "",
               quarantined: list[StagedFile] = ()) -> list[CommitRecord]:
        """Make the staged files of ``partition`` visible, with their record, and the rows its tasks
        set aside (``quarantined``) beside them; the records now committed (this partition's: a
        table's committer batches partitions, `tables.py`).

        Raises `SchemaMismatchError` (and commits nothing) when the partition's columns
        differ from those already committed to this path.
        """
        schema = self.schemas.check(partition, label, files)
        names = sorted(f.path.rsplit("/", 1)[-1] for f in files)
        aside = sorted(f.path.rsplit("/", 1)[-1] for f in quarantined)
        record = CommitRecord(
            partition=partition, label=label, files=[f"{partition_dir(partition, self.tag)}/{n}" for n in names],
            rows=sum(f.rows for f in files), bytes=sum(f.bytes for f in files), run_id=self.run_id,
            inputs=inputs, schema=schema, quarantined=[f"{partition_dir(partition, self.tag)}/{n}" for n in aside],
            quarantined_rows=sum(f.rows for f in quarantined),
        )
        names += aside
        self.lease.check()  # a writer whose lease was taken over commits nothing more
        final = f"{self.root}/{partition_dir(partition, self.tag)}"
        self._in_flight[partition_dir(partition)] = (final, names)
        try:
            self.protocol.publish(self.staging_dir(partition), final, names, json.dumps(asdict(record)).encode())
        except CommittedElsewhere as exc:
            del self._in_flight[partition_dir(partition)]
            raise FileExistsError(f"partition {partition} of {self.path} was committed by another writer "
                                  f"while this run computed it; nothing of this run's was added") from exc
        del self._in_flight[partition_dir(partition)]
        return [record]

    def flush(self) -> list[CommitRecord]:
        """Nothing waits: each partition was committed when its last task was done."""
        return []

    # -- removing -----------------------------------------------------------------------
    def wipe(self) -> int:
        """Delete every committed partition (its files and record) and all staging.

        Other entries under the path are left alone: an output path may hold other
        data (another epoch's output, a user's files) and only what a write of this
        engine committed is ours to delete. Refused while another live writer holds the
        path's lease (a full recompute would delete its commits and staging under it).
        Returns the partitions deleted.
        """
        write_lease.check_not_held_by_another(self.fs, self.root, "delete the committed partitions of", self.lease)
        committed = self.scan()
        for name in committed:
            self.protocol.delete_partition(f"{self.root}/{name}")
        for leftover in ("_staging", "_commits"):  # _commits: records of the layout before version 0.2
            if self.fs.get_file_info(f"{self.root}/{leftover}").type != pafs.FileType.NotFound:
                self.fs.delete_dir(f"{self.root}/{leftover}")
        if self.fs.get_file_info(f"{self.root}/{WRITE_STATE}").type != pafs.FileType.NotFound:
            self.fs.delete_file(f"{self.root}/{WRITE_STATE}")
        return len(committed)

    def cleanup(self) -> None:
        """Remove this run's staging (uncommitted files of failed or unfinished partitions): the
        next writer must not see this run's leftovers as its own. The lease stays with its target."""
        run_staging = f"{self.root}/_staging/{self.run_id}"
        if self._in_flight:  # a commit that failed midway (an object store's copy): finish it if it was decided
            try:
                self.protocol.settle(run_staging, self._in_flight)
            except OSError as exc:
                log.error("could not finish the commit of %s (%s); its staged files stay under %s for the next "
                          "write to finish", sorted(self._in_flight), exc, run_staging)
                return
        if self.fs.get_file_info(run_staging).type != pafs.FileType.NotFound:
            self.fs.delete_dir(run_staging)
        remove_if_empty(self.fs, f"{self.root}/_staging")

    def _sweep_dead_staging(self) -> None:
        """On object stores every other run's staging is dead (this run holds the lease, so
        they stopped, or were fenced off): commits they left half copied are finished, then
        their staging removed. On POSIX filesystems (commits all or nothing), staging of
        drivers that died on this host is removed."""
        selector = pafs.FileSelector(f"{self.root}/_staging", allow_not_found=True)
        dead = [info for info in self.fs.get_file_info(selector) if info.type == pafs.FileType.Directory]
        if isinstance(self.protocol, CopyCommit):
            records = self.scan() if dead else {}
            for info in dead:
                run = info.base_name
                left = {partition_dir(rec.partition): (f"{self.root}/{name}", [f.rsplit("/", 1)[-1] for f in
                                                                               rec.files + rec.quarantined])
                        for name, rec in records.items() if rec.run_id == run}
                self.protocol.settle(info.path, left)
                self.fs.delete_dir(info.path)
            return
        for info in dead:
            try:
                with self.fs.open_input_stream(f"{info.path}/{OWNER_FILE}") as f:
                    mark = f.read().decode()
            except OSError:
                continue  # being created right now, or not ours: leave it
            if left_by_dead_driver(mark):
                log.info("removing staging of dead driver (%s) under %s", mark, self.path)
                self.fs.delete_dir(info.path)
