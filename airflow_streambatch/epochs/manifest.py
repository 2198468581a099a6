"""The epoch manifest: every input partition of one data interval, frozen.

It is the lineage root of an epoch: the path, size and etag or mtime of each input
file, taken when the frontier passed the interval's end. A run reads exactly these
partitions in order, so partition ``i`` of a retry is partition ``i`` of the first
try and its commit record can be trusted. A partition is a file, or, for a Parquet
file larger than ``max_partition_bytes``, a range of its row groups (`split_partitions`),
so a 10 GiB file is many read tasks and many units of retry, not one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

import pyarrow.fs as pafs

from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.plan.datasource import Fragment, list_files
from airflow_streambatch.engine.filesystems import resolve
from airflow_streambatch.engine.read_api import parquet_row_group_ranges

# Spark's spark.sql.files.maxPartitionBytes default: a partition of about one block
DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024
_RANGE_KEYS = ("row_groups", "range_bytes")  # absent from the JSON of a whole-file partition


@dataclass(frozen=True)
class InputPartition:
    """One input partition: a whole file, or row groups ``[start, stop)`` of a Parquet file.

    ``size``, ``mtime`` and ``etag`` are always the whole file's: they are what
    `EpochManifest.verify_unchanged` compares. ``range_bytes`` is the range's stored
    size, for planning. A whole-file partition has neither key in its JSON, so
    manifests written before ranges existed load, and fingerprint, as they did.
    """

    path: str
    size: int
    mtime: float | None = None
    etag: str | None = None
    row_groups: tuple[int, int] | None = None
    range_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.row_groups is None:
            return
        bounds = tuple(self.row_groups)
        if len(bounds) != 2 or not all(isinstance(b, int) for b in bounds) or not 0 <= bounds[0] < bounds[1]:
            raise ValueError(f"manifest partition {self.path}: row_groups must be [start, stop) with "
                             f"0 <= start < stop, got {self.row_groups!r}")
        object.__setattr__(self, "row_groups", bounds)  # JSON gives a list

    def to_dict(self) -> dict:
        data = asdict(self)
        for key in _RANGE_KEYS:
            if data[key] is None:
                del data[key]
        if self.row_groups is not None:
            data["row_groups"] = list(self.row_groups)
        return data

    def fragment(self) -> Fragment:
        """What the engine reads for this partition (its identity covers the row groups)."""
        mtime_ns = round(self.mtime * 1e9) if self.mtime is not None else 0
        if self.row_groups is None:
            return Fragment(self.path, self.size, None, mtime_ns)
        size = self.range_bytes if self.range_bytes is not None else self.size
        return Fragment(self.path, size, tuple(range(*self.row_groups)), mtime_ns)


def split_partitions(partitions: list[InputPartition],
                     max_partition_bytes: int | None = DEFAULT_MAX_PARTITION_BYTES) -> list[InputPartition]:
    """Each Parquet file larger than ``max_partition_bytes`` as row-group ranges of about that size.

    Only files over the limit are opened, and only their footers are read; a file
    that is not Parquet (or cannot be read: its read task will say why), or has one
    row group, stays whole. Files are never combined, and a row group is never cut.
    Partitions that are already ranges are kept, so splitting twice changes nothing.
    ``None`` keeps every file whole (one partition per file, as before ranges existed).
    """
    if max_partition_bytes is None:
        return list(partitions)
    check_positive_int(max_partition_bytes, "max_partition_bytes")
    result: list[InputPartition] = []
    for part in partitions:
        ranges = None
        if part.row_groups is None and part.size > max_partition_bytes:
            ranges = parquet_row_group_ranges(part.path, max_partition_bytes)
        if not ranges:
            result.append(part)
            continue
        result.extend(InputPartition(part.path, part.size, part.mtime, part.etag, (start, stop), nbytes)
                      for start, stop, nbytes in ranges)
    return result


def list_inputs(path: str, suffixes: tuple[str, ...] = (), missing_ok: bool = False) -> list[InputPartition]:
    """The input files under ``path`` (hidden and ``_``-prefixed paths skipped), with
    size and modification time, in path order. ``missing_ok``: no files yet is an
    empty list (a sensor polling for an epoch), not an error.

    One recursive listing gives sizes and mtimes (no call per file: 50,000 files list in
    well under a second locally, and in a few pages of an object store's LIST). The
    mtime is the float `pyarrow.fs.FileInfo.mtime` gives, as `verify_unchanged` compares it.
    """
    try:
        files = list_files(path, suffixes)
    except FileNotFoundError:
        if missing_ok:
            return []
        raise
    return [InputPartition(f.path, f.size,
                           datetime.fromtimestamp(f.mtime_ns / 1.0e9, timezone.utc).timestamp() if f.mtime_ns else None)
            for f in files]


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
        partitions = [p.to_dict() for p in self.partitions]
        return hashlib.sha256(json.dumps(partitions, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def paths(self) -> list[str]:
        """One path per partition (a file split into row-group ranges appears once per range)."""
        return [p.path for p in self.partitions]

    @property
    def files(self) -> list[str]:
        """The distinct input files, in manifest order."""
        return list(dict.fromkeys(self.paths))

    @property
    def total_bytes(self) -> int:
        """The input files' bytes, each file once however many ranges it was split into."""
        return sum({p.path: p.size for p in self.partitions}.values())

    def split(self, max_partition_bytes: int | None = DEFAULT_MAX_PARTITION_BYTES) -> EpochManifest:
        """This manifest with large Parquet files as row-group ranges (`split_partitions`)."""
        return EpochManifest(self.interval_start, self.interval_end,
                             split_partitions(self.partitions, max_partition_bytes))

    def listing(self) -> dict:
        """path -> [size, mtime]: what quiescence compares between pokes."""
        return {p.path: [p.size, p.mtime] for p in self.partitions}

    def to_dict(self) -> dict:
        """JSON-ready (for XCom and the durable manifest next to the output)."""
        return {"interval_start": self.interval_start, "interval_end": self.interval_end,
                "partitions": [p.to_dict() for p in self.partitions]}

    @classmethod
    def from_dict(cls, data: dict) -> EpochManifest:
        return cls(data["interval_start"], data["interval_end"],
                   [InputPartition(**p) for p in data.get("partitions", [])])

    def verify_unchanged(self) -> None:
        """Raise if an input changed since the manifest froze it (the epoch is no longer
        what its committed partitions were computed from)."""
        for part in {p.path: p for p in self.partitions}.values():  # a file split into ranges: one look
            fs, inner = resolve(part.path)
            info = fs.get_file_info(inner)
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(f"input {part.path} of epoch {self.interval_start}..{self.interval_end} "
                                        "disappeared after the epoch's manifest was taken")
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            if info.size != part.size or (part.mtime is not None and mtime != part.mtime):
                raise ValueError(f"input {part.path} changed after the epoch's manifest was taken "
                                 f"(size {part.size} -> {info.size}); the frontier had not passed it")
