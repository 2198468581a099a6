"""Input partitions through a run: what is still in flight, what failed, what committed.

When a run commits or isolates per partition, every block descends from exactly one
input partition (bundles do not mix them then), so the driver can tell when a
partition has left the pipeline: its read task is done and none of its blocks waits
in a queue or feeds a running task. At that moment a write's partition is committed
(`commit.PartitionCommitter`), unless it failed. Failing a partition drops its
blocks and never commits it; the rest go on.

A write after ``repartition(n)`` commits per output block instead: every output block
mixes rows of every input partition, so at the barrier the input partitions are
forgotten and output block ``j`` becomes partition ``j`` (`relabel_at_barrier`). Before
the last barrier nothing is committed, and a failed partition fails the whole write:
the blocks after the barrier would lack its rows, and no commit unit could say so.
"""

from __future__ import annotations

import logging
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.output.commit import CommitRecord, PartitionCommitter, SchemaMismatchError
from airflow_streambatch.engine.protocol.staging import StagedFile
from airflow_streambatch.engine.errors import PartialResultWarning, PartitionFailure, partitions_failed

log = logging.getLogger("airflow_streambatch.engine.progress")

def warn_if_partial(failures: list[PartitionFailure]) -> None:
    """A finished run lacks the rows of failed partitions: say so, never return them silently."""
    if not failures:
        return
    names = "; ".join(f.describe() for f in failures[:5]) + (" ..." if len(failures) > 5 else "")
    message = (f"{len(failures)} input partition(s) failed and their rows are missing from this result "
               f"(DataContext.max_failed_partitions allowed it): {names}")
    log.warning("%s", message)
    warnings.warn(message, PartialResultWarning, stacklevel=4)


@dataclass
class WriteResult:
    """What a ``write_*`` did, partition by partition."""

    path: str
    committed: dict[int, CommitRecord] = field(default_factory=dict)
    skipped: dict[int, CommitRecord] = field(default_factory=dict)  # committed by an earlier run
    failed: list[PartitionFailure] = field(default_factory=list)

    @property
    def files(self) -> list[str]:
        records = {**self.skipped, **self.committed}
        return [f"{self.path.rstrip('/')}/{name}" for _, rec in sorted(records.items()) for name in rec.files]

    @property
    def rows(self) -> int:
        return sum(rec.rows for rec in self.committed.values())

    @property
    def partial(self) -> bool:
        """Some input partitions failed: the output lacks their rows."""
        return bool(self.failed)


class PartitionTracker:
    """:param barriers: repartitions before the sink of a write; partitions are relabelled at each."""

    def __init__(self, committer: PartitionCommitter | None, sink_name: str = "", barriers: int = 0):
        self.committer = committer
        self.sink_name = sink_name
        self.barriers_left = barriers if committer is not None else 0
        self.outstanding: dict[int, int] = defaultdict(int)
        self.labels: dict[int, str] = {}
        self.identities: dict[int, str] = {}
        self.failures: dict[int, PartitionFailure] = {}
        self.files: dict[int, list[StagedFile]] = defaultdict(list)
        self.quarantined: dict[int, dict[str, StagedFile]] = defaultdict(dict)  # by path: a replay writes it again
        self.committed: dict[int, CommitRecord] = {}
        self._held: set[str] = set()
        self.on_commit: Callable[[CommitRecord], None] | None = None

    def add_read(self, partition: int, label: str, identity: str = "") -> None:
        """A read task is pending for ``partition``: it is in flight until that task is done."""
        self.labels[partition] = label
        self.identities[partition] = identity
        self.outstanding[partition] += 1

    def label(self, partition: int) -> str:
        return self.labels.get(partition, f"partition {partition}")

    def read_done(self, partition: int) -> None:
        self._decrement(partition)

    def hold(self, ref: BlockRef) -> None:
        """``ref`` now waits in an operator's queue (or feeds a task)."""
        if ref.block_id not in self._held:
            self._held.add(ref.block_id)
            for p in ref.partitions:
                self.outstanding[p] += 1

    def drop(self, ref: BlockRef) -> None:
        if ref.block_id in self._held:
            self._held.discard(ref.block_id)
            for p in ref.partitions:
                self._decrement(p)

    def split(self, whole: BlockRef, parts: list[BlockRef]) -> None:
        """A held block replaced by slices of it: they are held before it is dropped, so its
        partitions cannot commit in between."""
        if whole.block_id in self._held:
            for part in parts:
                self.hold(part)
            self.drop(whole)

    def add_files(self, partitions: tuple[int, ...], files: list[StagedFile]) -> None:
        for p in partitions:
            self.files[p].extend(files)

    def add_quarantined(self, partitions: tuple[int, ...], files: list[StagedFile]) -> None:
        for file in files:
            self.quarantined[partitions[0]][file.path] = file

    def is_failed(self, partitions: tuple[int, ...]) -> bool:
        return any(p in self.failures for p in partitions)

    def fail(self, failure: PartitionFailure) -> None:
        if failure.partition not in self.failures:
            log.warning("input partition failed: %s", failure.describe())
        self.failures.setdefault(failure.partition, failure)
        if self.barriers_left:
            error = partitions_failed(list(self.failures.values()), 0)
            error.add_note(f"The write ({self.sink_name}) follows a repartition(), which mixes every partition into "
                           "every output block: without this partition's rows no block can be committed whole, so "
                           "the write stops, whatever DataContext.max_failed_partitions allows. Nothing was committed.")
            raise error

    def relabel_at_barrier(self, groups: list[tuple[int, list[BlockRef]]],
                           num_blocks: int) -> list[tuple[int, list[BlockRef]]]:
        """A repartition cut its input into ``groups`` (output index, input slices): from now on
        output block ``j`` is partition ``j``. Every input partition has been read by now (the
        barrier waits for all input), so they are forgotten: their blocks, held by the barrier,
        are released without committing anything. Returns the groups with relabelled slices, each
        held for its partition until the task that reads it is done."""
        self.barriers_left -= 1
        for mapping in (self.outstanding, self.labels, self.identities, self.files, self.quarantined):
            mapping.clear()
        self._held.clear()
        relabelled = []
        for j, slices in groups:
            self.labels[j] = f"block {j} of repartition({num_blocks})"
            moved = [replace(ref, partitions=(j,)) for ref in slices]
            for ref in moved:
                self.hold(ref)
            relabelled.append((j, moved))
        return relabelled

    def _decrement(self, partition: int) -> None:
        """One thing ``partition`` waited for is done; with none left (and no failure), commit it."""
        self.outstanding[partition] -= 1
        if self.outstanding[partition] > 0 or partition in self.failures or self.committer is None:
            return
        if self.barriers_left:  # an input partition of a write that commits after a repartition
            return
        label, files = self.label(partition), self.files.pop(partition, [])
        quarantined = list(self.quarantined.pop(partition, {}).values())
        try:
            records = self.committer.commit(partition, label, files, self.identities.get(partition, ""), quarantined)
        except (SchemaMismatchError, FileExistsError) as exc:
            self.fail(PartitionFailure(partition, label, self.sink_name, f"{type(exc).__name__}: {exc}"))
            return
        self._landed(records)

    def finish_write(self, error: BaseException | None) -> BaseException | None:
        """The run ended: commit what waits to be committed (a table's last batch: its partitions
        are done, whether or not the run failed), record whether the write committed every
        partition, then remove its staging. Returns the run's error, or the flush's."""
        try:
            self.flush()
        except Exception as exc:  # noqa: BLE001 - the consumer gets it, unless the run failed first
            log.error("the last commit of %s failed: %s", self.committer.path, exc)
            error = error or exc
        try:
            self.committer.finish(error is None and not self.failures)
        finally:
            self.committer.cleanup()
        return error

    def flush(self) -> None:
        """Commit what the committer still holds (a table's last batch): the run's work is done."""
        if self.committer is not None:
            self._landed(self.committer.flush())

    def _landed(self, records: list[CommitRecord]) -> None:
        for record in records:
            self.committed[record.partition] = record
            log.info("committed partition %d (%s): %d rows in %d file(s)%s", record.partition, record.label,
                     record.rows, len(record.files),
                     f", {record.quarantined_rows} row(s) quarantined" if record.quarantined_rows else "")
            if self.on_commit is not None:
                try:
                    self.on_commit(record)
                except Exception:  # an observer must not fail a partition that is already committed
                    log.exception("on_commit callback failed for partition %d; the commit stands", record.partition)
