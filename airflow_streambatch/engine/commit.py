"""Exactly-once output: each input partition's files are staged, then committed at once.

Layout under the sink's ``path``::

    _staging/<run id>/p00003/part-<task>.parquet   written by sink tasks
    p00003/part-<task>.parquet                     after the commit (directory rename)
    _commits/p00003.json                           the commit record: the authority

A partition is committed iff its record exists. Committing renames the staging
directory into place (replacing what an earlier, uncommitted attempt left) and
then writes the record through a temporary name. A replayed partition therefore
never leaves a second copy, and a run that finds a record skips the partition
without running anything for it. Readers skip ``_``-prefixed paths, so they never
see staged files; ``WriteResult.files`` lists exactly the committed ones.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from airflow_streambatch.engine.filesystems import resolve


@dataclass
class CommitRecord:
    partition: int
    label: str
    files: list[str]
    rows: int
    bytes: int
    run_id: str
    committed_at: float = field(default_factory=time.time)


def partition_dir(partition: int) -> str:
    return f"p{partition:05d}"


class PartitionCommitter:
    """Stages, commits and lists the per-partition output of one sink path."""

    def __init__(self, path: str, run_id: str):
        self.path = path.rstrip("/")
        self.run_id = run_id
        self.fs, self.root = resolve(self.path)
        self.root = self.root.rstrip("/")

    def staging_dir(self, partition: int) -> str:
        """Where sink tasks write this run's files of ``partition`` (inside the filesystem)."""
        return f"{self.root}/_staging/{self.run_id}/{partition_dir(partition)}"

    def committed(self) -> dict[int, CommitRecord]:
        selector = pafs.FileSelector(f"{self.root}/_commits", allow_not_found=True)
        records = {}
        for info in self.fs.get_file_info(selector):
            if info.type == pafs.FileType.File and info.base_name.endswith(".json"):
                with self.fs.open_input_stream(info.path) as f:
                    record = CommitRecord(**json.loads(f.read()))
                records[record.partition] = record
        return records

    def commit(self, partition: int, label: str, files: list[tuple[str, int, int]]) -> CommitRecord:
        """Move the staged files of ``partition`` into place and record them."""
        final = f"{self.root}/{partition_dir(partition)}"
        if self.fs.get_file_info(final).type != pafs.FileType.NotFound:
            self.fs.delete_dir(final)  # an uncommitted earlier attempt's leftovers
        staged = self.staging_dir(partition)
        names = sorted(p.rsplit("/", 1)[-1] for p, _, _ in files)
        if names:
            self.fs.move(staged, final)
        record = CommitRecord(
            partition=partition, label=label,
            files=[f"{partition_dir(partition)}/{name}" for name in names],
            rows=sum(r for _, r, _ in files), bytes=sum(b for _, _, b in files), run_id=self.run_id,
        )
        self.fs.create_dir(f"{self.root}/_commits", recursive=True)
        target = f"{self.root}/_commits/{partition_dir(partition)}.json"
        tmp = f"{target}.{uuid.uuid4().hex[:8]}.tmp"
        with self.fs.open_output_stream(tmp) as out:
            out.write(json.dumps(asdict(record)).encode())
        self.fs.move(tmp, target)
        return record

    def cleanup(self) -> None:
        run_staging = f"{self.root}/_staging/{self.run_id}"
        if self.fs.get_file_info(run_staging).type != pafs.FileType.NotFound:
            self.fs.delete_dir(run_staging)
