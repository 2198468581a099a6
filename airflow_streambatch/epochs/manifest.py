"""The epoch manifest: every input partition of one data interval, frozen.

It is the lineage root of an epoch: the path, size and etag or mtime of each input
file, taken when the frontier passed the interval's end. A run reads exactly these
files, one input partition per file in path order, so partition ``i`` of a retry
is partition ``i`` of the first try and its commit record can be trusted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import pyarrow.fs as pafs

from airflow_streambatch.engine.plan.datasource import expand_paths
from airflow_streambatch.engine.filesystems import resolve


@dataclass(frozen=True)
class InputPartition:
    path: str
    size: int
    mtime: float | None = None
    etag: str | None = None


def list_inputs(path: str, suffixes: tuple[str, ...] = (), missing_ok: bool = False) -> list[InputPartition]:
    """The input files under ``path`` (hidden and ``_``-prefixed paths skipped), with
    size and modification time, in path order. ``missing_ok``: no files yet is an
    empty list (a sensor polling for an epoch), not an error."""
    try:
        files = expand_paths(path, suffixes)
    except FileNotFoundError:
        if missing_ok:
            return []
        raise
    partitions = []
    for file_path, size in files:
        fs, inner = resolve(file_path)
        info = fs.get_file_info(inner)
        mtime = info.mtime.timestamp() if info.mtime is not None else None
        partitions.append(InputPartition(file_path, size, mtime))
    return partitions


@dataclass
class EpochManifest:
    """One epoch's identity (the data interval) and its frozen input partitions."""

    interval_start: str
    interval_end: str
    partitions: list[InputPartition] = field(default_factory=list)

    @property
    def fingerprint(self) -> str:
        """Changes when any input file is added, removed, resized or rewritten; nothing else.

        The interval bounds are not part of it: the same inputs are the same epoch content,
        so a manual trigger of an hour that already ran (Airflow may give it other bounds)
        finds its commits valid and reruns nothing, and only changed inputs are refused.
        """
        partitions = [asdict(p) for p in self.partitions]
        return hashlib.sha256(json.dumps(partitions, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def paths(self) -> list[str]:
        return [p.path for p in self.partitions]

    def listing(self) -> dict:
        """path -> [size, mtime]: what quiescence compares between pokes."""
        return {p.path: [p.size, p.mtime] for p in self.partitions}

    def to_dict(self) -> dict:
        """JSON-ready (for XCom and the durable manifest next to the output)."""
        return {"interval_start": self.interval_start, "interval_end": self.interval_end,
                "partitions": [asdict(p) for p in self.partitions]}

    @classmethod
    def from_dict(cls, data: dict) -> EpochManifest:
        return cls(data["interval_start"], data["interval_end"],
                   [InputPartition(**p) for p in data.get("partitions", [])])

    def verify_unchanged(self) -> None:
        """Raise if an input changed since the manifest froze it (the epoch is no longer
        what its committed partitions were computed from)."""
        for part in self.partitions:
            fs, inner = resolve(part.path)
            info = fs.get_file_info(inner)
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(f"input {part.path} of epoch {self.interval_start}..{self.interval_end} "
                                        "disappeared after the epoch's manifest was taken")
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            if info.size != part.size or (part.mtime is not None and mtime != part.mtime):
                raise ValueError(f"input {part.path} changed after the epoch's manifest was taken "
                                 f"(size {part.size} -> {info.size}); the frontier had not passed it")
