"""The epoch manifest: every input partition of one data interval, frozen.

It is the lineage root of an epoch: the path, size and mtime of each input
file, taken when the frontier passed the interval's end. A run reads exactly these
partitions in order, so partition ``i`` of a retry is partition ``i`` of the first
try and its commit record can be trusted. A partition is a file or, for a file larger
than ``max_partition_bytes``, a range of it (`split_partitions`): row groups of a Parquet
file, or a byte range of a line-based file's lines (text, CSV, JSON Lines). A 10 GiB
file is many read tasks and many units of retry, not one.
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
from airflow_streambatch.engine.parquet_ranges import parquet_row_group_ranges

# Spark's spark.sql.files.maxPartitionBytes default: a partition of about one block
DEFAULT_MAX_PARTITION_BYTES = 128 * 1024 * 1024
_RANGE_KEYS = ("row_groups", "byte_range", "range_bytes")  # absent from the JSON of a whole-file partition
# Line-based files that may be split into byte ranges (`engine.worker.line_ranges`); compressed ones
# (``.csv.gz``) end otherwise and stay whole, as Spark keeps files of non-splittable codecs whole.
LINE_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".txt", ".text", ".log")


@dataclass(frozen=True)
class InputPartition:
    """One input partition: a whole file, row groups ``[start, stop)`` of a Parquet file, or the
    lines that start in bytes ``[start, stop)`` of a line-based file.

    ``size``, ``mtime`` and ``etag`` are always the whole file's: they are what
    `EpochManifest.verify_unchanged` compares. ``range_bytes`` is the range's stored
    size, for planning. A whole-file partition has none of these keys in its JSON, so
    manifests written before ranges existed load, and fingerprint, as they did.
    """

    path: str
    size: int
    mtime: float | None = None
    etag: str | None = None
    row_groups: tuple[int, int] | None = None
    range_bytes: int | None = None
    byte_range: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.row_groups is not None and self.byte_range is not None:
            raise ValueError(f"manifest partition {self.path}: row_groups and byte_range exclude each other")
        for key in ("row_groups", "byte_range"):
            value = getattr(self, key)
            if value is None:
                continue
            bounds = tuple(value)
            if len(bounds) != 2 or not all(isinstance(b, int) for b in bounds) or not 0 <= bounds[0] < bounds[1]:
                raise ValueError(f"manifest partition {self.path}: {key} must be [start, stop) with "
                                 f"0 <= start < stop, got {value!r}")
            object.__setattr__(self, key, bounds)  # JSON gives a list

    def to_dict(self) -> dict:
        data = asdict(self)
        for key in _RANGE_KEYS:
            if data[key] is None:
                del data[key]
        for key in ("row_groups", "byte_range"):
            if key in data:
                data[key] = list(data[key])
        return data

    def fragment(self) -> Fragment:
        """What the engine reads for this partition (its identity covers the row groups)."""
        mtime_ns = round(self.mtime * 1e9) if self.mtime is not None else 0
        if self.byte_range is not None:
            return Fragment(self.path, self.byte_range[1] - self.byte_range[0], None, mtime_ns, self.byte_range)
        if self.row_groups is None:
            return Fragment(self.path, self.size, None, mtime_ns)
        size = self.range_bytes if self.range_bytes is not None else self.size
        return Fragment(self.path, size, tuple(range(*self.row_groups)), mtime_ns)

    @property
    def whole(self) -> bool:
        return self.row_groups is None and self.byte_range is None


def split_partitions(partitions: list[InputPartition],
                     max_partition_bytes: int | None = DEFAULT_MAX_PARTITION_BYTES) -> list[InputPartition]:
    """Each file larger than ``max_partition_bytes`` as ranges of about that size.

    A Parquet file becomes row-group ranges (only its footer is read; a row group is
    never cut). A line-based file (`LINE_SUFFIXES`) becomes byte ranges of equal size,
    computed from its size alone; the reader gives each range the lines that start in
    it. A ``.json`` file holding one JSON array cannot be cut at lines and stays whole
    (its first bytes are read to tell). Any other file, an unreadable one (its read
    task will say why), or one that fits, stays whole; files are never combined.
    Partitions that are already ranges are kept, so splitting twice changes nothing.
    ``None`` keeps every file whole (one partition per file, as before ranges existed).
    """
    if max_partition_bytes is None:
        return list(partitions)
    check_positive_int(max_partition_bytes, "max_partition_bytes")
    result: list[InputPartition] = []
    for part in partitions:
        if not part.whole or part.size <= max_partition_bytes:
            result.append(part)
        elif part.path.lower().endswith(LINE_SUFFIXES):
            result.extend(_byte_ranges(part, max_partition_bytes))
        else:
            ranges = parquet_row_group_ranges(part.path, max_partition_bytes) or []
            result.extend([InputPartition(part.path, part.size, part.mtime, part.etag, (start, stop), nbytes)
                           for start, stop, nbytes in ranges] or [part])
    return result


def _byte_ranges(part: InputPartition, max_bytes: int) -> list[InputPartition]:
    if part.path.lower().endswith(".json") and _holds_json_array(part.path):
        return [part]
    count = -(-part.size // max_bytes)
    bounds = [part.size * i // count for i in range(count + 1)]
    return [InputPartition(part.path, part.size, part.mtime, part.etag, range_bytes=stop - start,
                           byte_range=(start, stop)) for start, stop in zip(bounds, bounds[1:])]


def _holds_json_array(path: str) -> bool:
    fs, inner = resolve(path)
    try:
        with fs.open_input_stream(inner) as f:
            head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    except OSError:
        return True  # unreadable: keep it whole, and its read task names the error
    return not head.startswith(b"{")


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
        """This manifest with large files as ranges (`split_partitions`)."""
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
