"""Input partitions through a run: what is still in flight, what failed, what committed.

When a run commits or isolates per partition, every block descends from exactly one
input partition (bundles do not mix them then), so the driver can tell when a
partition has left the pipeline: its read task is done and none of its blocks waits
in a queue or feeds a running task. At that moment a write's partition is committed
(`commit.PartitionCommitter`), unless it failed. Failing a partition drops its
blocks and never commits it; the rest go on.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_streambatch.engine.blocks import BlockRef
from airflow_streambatch.engine.commit import CommitRecord, PartitionCommitter
from airflow_streambatch.engine.errors import PartitionFailure

log = logging.getLogger("airflow_streambatch.engine.progress")


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


class PartitionTracker:
    def __init__(self, committer: PartitionCommitter | None):
        self.committer = committer
        self.outstanding: dict[int, int] = defaultdict(int)
        self.labels: dict[int, str] = {}
        self.failures: dict[int, PartitionFailure] = {}
        self.files: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
        self.committed: dict[int, CommitRecord] = {}
        self._held: set[str] = set()
        self.on_commit: Callable[[CommitRecord], None] | None = None

    def add_read(self, partition: int, label: str) -> None:
        """A read task is pending for ``partition``: it is in flight until that task is done."""
        self.labels[partition] = label
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

    def add_files(self, partitions: tuple[int, ...], files: list[tuple[str, int, int]]) -> None:
        for p in partitions:
            self.files[p].extend(files)

    def is_failed(self, partitions: tuple[int, ...]) -> bool:
        return any(p in self.failures for p in partitions)

    def fail(self, failure: PartitionFailure) -> None:
        if failure.partition not in self.failures:
            log.warning("input partition failed: %s", failure.describe())
        self.failures.setdefault(failure.partition, failure)

    def _decrement(self, partition: int) -> None:
        self.outstanding[partition] -= 1
        if self.outstanding[partition] > 0 or partition in self.failures or self.committer is None:
            return
        record = self.committer.commit(partition, self.label(partition), self.files.pop(partition, []))
        self.committed[partition] = record
        log.info("committed partition %d (%s): %d rows in %d file(s)", partition, record.label, record.rows,
                 len(record.files))
        if self.on_commit is not None:
            try:
                self.on_commit(record)
            except Exception:  # an observer must not fail a partition that is already committed
                log.exception("on_commit callback failed for partition %d; the commit stands", partition)
