"""Sources: turning paths, items and ranges into read tasks.

A `ReadTask` is one input partition, the root of lineage: it says what it reads
(so errors can name the file) and roughly how many bytes (so the planner and the
source budget can size it), and yields Arrow tables when run on an executor.

`partition_count` is the initial partitioning of paper section 4.1: two tasks per
execution slot, no more than there are fragments (files or parquet row groups), and
blocks of at most ``target_max_block_size``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.fs as pafs

from airflow_streambatch.engine.errors import NoInputFilesError, read_error
from airflow_streambatch.engine.filesystems import resolve_in
from airflow_streambatch.engine.worker.tensors import rows_table

log = logging.getLogger("airflow_streambatch.engine.progress")

READ_BATCH_ROWS = 65536


@dataclass(frozen=True)
class Fragment:
    """A piece of input: a whole file, some row groups of a Parquet file, or the lines that
    start in a byte range ``[start, stop)`` of a line-based file (`worker.line_ranges`)."""

    path: str
    size: int
    row_groups: tuple[int, ...] | None = None
    mtime_ns: int = 0
    byte_range: tuple[int, int] | None = None

    @property
    def identity(self) -> list:
        """What a commit record fingerprints; a whole file's is what it was before byte ranges existed."""
        identity = [self.path, self.size, self.mtime_ns, self.row_groups]
        return identity + [list(self.byte_range)] if self.byte_range is not None else identity


@dataclass
class ReadTask:
    """One input partition: ``read()`` yields its tables on an executor.

    ``identity`` fingerprints what it reads (files with sizes, modification times and
    row groups; the rows of ``from_items``): a commit records it, so a resumed write
    can tell a partition computed from other input.
    """

    label: str
    estimated_bytes: int
    read: Callable[[], Iterator[pa.Table]]
    identity: str = ""
    files: tuple[str, ...] = ()  # the files it reads (``Dataset.input_files``)


@dataclass
class Datasource:
    """Everything a read needs before planning: a name and a way to list read tasks."""

    name: str
    plan: Callable[[int, int | None, int], list[ReadTask]]  # (slots, override_num_blocks, target bytes)
    paths: tuple[str, ...] = ()  # the input paths of a file source (a write must not land inside them)
    num_rows: int | None = None  # rows known before reading (range, from_items): random_sample refuses 0
    meta_rows: Callable[[], int | None] | None = None  # rows from metadata, found on asking (Parquet footers)
    meta_schema: Callable[[], pa.Schema | None] | None = None  # the output schema from metadata (``repr``)
    in_memory: bool = False  # data held by the driver (``from_*``): its lineage cannot be serialized, as in Ray


@dataclass(frozen=True)
class InputFile:
    path: str
    size: int
    mtime_ns: int


# Formats recognised by content where a file's name does not say (Hive's ``000000_0``)
MAGIC = {".parquet": b"PAR1"}


def list_files(paths: str | list[str], suffixes: tuple[str, ...] = (), *, filesystem: pafs.FileSystem | None = None,
               ignore_missing: bool = False, extensions: tuple[str, ...] | None = None,
               keep=None, files_only: str | None = None) -> list[InputFile]:
    """Files under ``paths``; hidden and ``_``-prefixed paths are skipped.

    With ``suffixes``, a directory's files must end in one of them (any case) or start
    with the format's magic bytes; the rest are skipped with a warning that names
    them, never silently. Files named explicitly are always read. With ``extensions``
    (Ray Data's ``file_extensions``, without dots), every file, named or listed, must
    end in ``.`` and one of them, any case; the rest are skipped with a warning.
    ``filesystem``: the paths are in it (`resolve_in`); ``ignore_missing``: a path
    that does not exist is skipped instead of raising; ``keep``: a callable that
    returns the paths to keep of those listed (Ray Data's ``partition_filter``); ``files_only``
    (the reading function's name): a directory among ``paths`` is an `IsADirectoryError`
    naming it instead of being listed (``read_parquet_bulk``, as Ray's).
    """
    if isinstance(paths, str):
        paths = [paths]
    found: list[InputFile] = []
    skipped: list[str] = []
    lowered = tuple(s.lower() for s in suffixes)
    magics = {MAGIC[s] for s in lowered if s in MAGIC}
    for path in paths:
        fs, inner = resolve_in(path, filesystem)
        info = fs.get_file_info(inner)
        if info.type == pafs.FileType.NotFound:
            if ignore_missing:
                continue
            raise FileNotFoundError(f"input path does not exist: {path}")
        prefix = path[: len(path) - len(inner)] if "://" in path and filesystem is None else ""
        if info.type == pafs.FileType.File:
            found.append(InputFile(path if filesystem is None else inner, info.size, info.mtime_ns or 0))
            continue
        if files_only:
            raise IsADirectoryError(f"{files_only} reads files only, and {path} is a directory: list its files, "
                                    "or pass meta_provider=DefaultFileMetadataProvider() to list it")
        for entry in sorted(fs.get_file_info(pafs.FileSelector(inner, recursive=True)), key=lambda e: e.path):
            relative = entry.path[len(inner.rstrip("/")) + 1:].split("/")
            if entry.type != pafs.FileType.File or any(part.startswith((".", "_")) for part in relative):
                continue  # hidden and _-prefixed files and directories (_staging, _SUCCESS, _commit.json)
            if lowered and not entry.base_name.lower().endswith(lowered) and not _starts_with(fs, entry, magics):
                skipped.append(prefix + entry.path)
                continue
            found.append(InputFile(prefix + entry.path, entry.size, entry.mtime_ns or 0))
    if extensions is not None:
        ends = tuple("." + e.lower() for e in extensions)
        skipped += [f.path for f in found if not f.path.lower().endswith(ends)]
        found = [f for f in found if f.path.lower().endswith(ends)]
        suffixes = tuple("." + e for e in extensions)
    if skipped:
        shown = ", ".join(skipped[:10]) + (f" and {len(skipped) - 10} more" if len(skipped) > 10 else "")
        log.warning("skipped %d file(s) under %s that are not %s files (by name and content): %s",
                    len(skipped), paths, "/".join(suffixes), shown)
    filtered = 0
    if keep is not None:
        kept = set(keep([f.path for f in found]))
        filtered = sum(f.path not in kept for f in found)
        found = [f for f in found if f.path in kept]
    if not found:
        raise NoInputFilesError(f"No input files found to read under {paths}"
                                + (f" ({filtered} file(s) left out by partition_filter)" if filtered else "")
                                + (f" ({len(skipped)} file(s) skipped, see the warning)" if skipped else "")
                                + (" (missing paths ignored: ignore_missing_paths=True)" if ignore_missing else ""))
    return found


def _starts_with(fs: pafs.FileSystem, entry: pafs.FileInfo, magics: set[bytes]) -> bool:
    if not magics or not entry.size:
        return False
    with fs.open_input_file(entry.path) as f:
        head = f.read(max(len(m) for m in magics))
    return any(head.startswith(m) for m in magics)


def expand_paths(paths: str | list[str], suffixes: tuple[str, ...] = (), **listing) -> list[tuple[str, int]]:
    """``(path, size)`` of the files `list_files` finds (``listing``: its keyword arguments)."""
    return [(f.path, f.size) for f in list_files(paths, suffixes, **listing)]


def fingerprint(value) -> str:
    """A short, stable hash of JSON-able ``value`` (what a read task reads)."""
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def partition_count(total_bytes: int, pieces: int, slots: int, override: int | None, target_bytes: int,
                    at_least: int = 0) -> int:
    """How many read tasks: ``override`` if given, else two per slot (so every slot has a task
    and the next is ready when one ends, as Ray Data reads at least two blocks per CPU) and
    enough that none is over ``target_bytes``; never more than ``pieces``. (A floor of 1 MiB
    per task made 1 MB of sentences one task, and a model with two copies ran on one:
    issue 28.) ``at_least``: a source's own floor (`MIN_READ_TASKS`)."""
    count = override or max(2 * slots, at_least, math.ceil(total_bytes / target_bytes))
    return max(1, min(pieces, count))


def group_fragments(fragments: list[Fragment], count: int) -> list[list[Fragment]]:
    """Split fragments into ``count`` contiguous groups of about equal bytes: each goes to
    the group its middle byte falls in. (Cutting where the bytes so far reached a group's
    share put 3, 2, 2 and 1 of 8 files of nearly equal size into 4 groups: W4's reads.)"""
    sizes = [f.size for f in fragments] if any(f.size for f in fragments) else [1] * len(fragments)
    per_group = sum(sizes) / count
    groups: list[list[Fragment]] = [[]]
    acc = 0.0
    for i, (frag, size) in enumerate(zip(fragments, sizes)):
        remaining_frags = len(fragments) - i
        remaining_groups = count - len(groups)
        middle_in = (acc + size / 2) / per_group  # which group's share its middle byte lies in
        if groups[-1] and len(groups) < count and (middle_in >= len(groups) or remaining_frags <= remaining_groups):
            groups.append([])
        groups[-1].append(frag)
        acc += size
    return groups


def file_datasource(name: str, paths, suffixes: tuple[str, ...], reader: Callable[[Fragment], Iterator[pa.Table]],
                    split_fragments: Callable[[str, int], list[Fragment]] | None = None,
                    listing: dict | None = None) -> Datasource:
    """A datasource over files; ``reader`` turns one fragment into tables on an executor.
    ``listing``: `list_files` keyword arguments (``filesystem``, ``ignore_missing``, ``extensions``)."""

    def plan(slots: int, override: int | None, target_bytes: int) -> list[ReadTask]:
        files = list_files(paths, suffixes, **(listing or {}))
        fragments = [Fragment(f.path, f.size, mtime_ns=f.mtime_ns) for f in files]
        total = sum(f.size for f in files)
        wanted = partition_count(total, 1 << 30, slots, override, target_bytes)
        split = split_fragments is not None and len(fragments) < wanted
        if split:
            fragments = [replace(piece, mtime_ns=f.mtime_ns)
                         for f in files for piece in split_fragments(f.path, f.size)]
        count = partition_count(total, len(fragments), slots, override, target_bytes,
                                at_least=0 if split else MIN_READ_TASKS)
        tasks = []
        for group in group_fragments(fragments, count):
            label = group[0].path if len(group) == 1 else f"{group[0].path} (+{len(group) - 1} more)"
            identity = fingerprint([f.identity for f in group])
            tasks.append(ReadTask(label, sum(f.size for f in group), _read_group(tuple(group), reader), identity,
                                  tuple(dict.fromkeys(f.path for f in group))))
        return tasks

    return Datasource(name, plan, tuple([paths] if isinstance(paths, str) else paths))


def fragments_datasource(name: str, fragments: list[Fragment],
                         reader: Callable[[Fragment], Iterator[pa.Table]]) -> Datasource:
    """A datasource whose partitions were decided before the read: one read task per fragment, in order.

    An epoch manifest freezes its partitions (whole files, or row-group ranges of large
    Parquet files) when the frontier passes, so partition ``i`` must be fragment ``i`` on
    every try, whatever the slots, ``override_num_blocks`` or block size: commit records
    are keyed by that index and checked against the fragment's identity (path, size,
    modification time and row groups).
    """
    fragments = list(fragments)

    def plan(slots: int, override: int | None, target_bytes: int) -> list[ReadTask]:
        return [ReadTask(fragment_label(f), f.size, _read_group((f,), reader),
                         fingerprint([f.identity]), (f.path,))
                for f in fragments]

    return Datasource(name, plan, tuple(dict.fromkeys(f.path for f in fragments)))


def fragment_label(fragment: Fragment) -> str:
    """How logs, commit records and errors name a fragment: its path, and its row groups or byte
    range if not all of it."""
    if fragment.byte_range is not None:
        return f"{fragment.path} [bytes {fragment.byte_range[0]}-{fragment.byte_range[1]})"
    groups = fragment.row_groups
    if groups is None:
        return fragment.path
    if len(groups) > 1 and list(groups) == list(range(groups[0], groups[-1] + 1)):
        return f"{fragment.path} [row groups {groups[0]}-{groups[-1]}]"
    return f"{fragment.path} [row groups {', '.join(map(str, groups))}]"


def _read_group(group: tuple[Fragment, ...], reader) -> Callable[[], Iterator[pa.Table]]:
    def read() -> Iterator[pa.Table]:
        for fragment in group:
            try:
                yield from reader(fragment)
            except (OSError, pa.ArrowException, ValueError, UnicodeDecodeError) as exc:
                raise read_error(exc, f"cannot read {fragment_label(fragment)}: {type(exc).__name__}: {exc}") from exc

    return read


# Read tasks at least (Ray Data's ``read_op_min_num_blocks``, 200), as many as there are rows of
# ``range`` and ``from_items`` or whole files: rows are often units of work (a task id, a URL,
# a prompt) far costlier than their bytes, and so is a file of them; a task per few rows costs
# a few milliseconds (`execution/check_ins.py`) and cheap blocks are merged back by task sizing
# (`operators/map.py`). Two per slot made W1's 48 one-second loads 8 tasks of six (1.20-1.33x
# its optimum against 1.12-1.17x with 48), and W7's 48 files of them 12 (issue 28).
MIN_READ_TASKS = 200


def row_ranges(n: int, row_bytes: int, slots: int, override: int | None, target_bytes: int) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` row ranges of the read tasks of a source of ``n`` rows known before
    reading (about ``row_bytes`` each): even, at least `MIN_READ_TASKS` of them (`partition_count`)."""
    count = partition_count(row_bytes * n, n, slots, override, target_bytes, at_least=MIN_READ_TASKS)
    bounds = [round(i * n / count) for i in range(count + 1)]
    return list(zip(bounds, bounds[1:]))


def items_datasource(items: list) -> Datasource:
    rows = [item if isinstance(item, dict) else {"item": item} for item in items]

    def plan(slots: int, override: int | None, target_bytes: int) -> list[ReadTask]:
        types = _item_types(rows)
        return [
            ReadTask(f"items[{lo}:{hi}]", 64 * (hi - lo), _const_read(rows[lo:hi], types), fingerprint(rows[lo:hi]))
            for lo, hi in row_ranges(len(rows), 64, slots, override, target_bytes)
        ]

    return Datasource("FromItems", plan, num_rows=len(rows), in_memory=True)


def _item_types(rows: list[dict]) -> dict[str, pa.DataType]:
    """Each column's type over all the items, where Arrow finds one: a slice whose values of a
    column are all None would otherwise type it null, and its block would not join the others'
    (``from_items([{"a": 1}, {"a": None}])`` cut one item a block, then repartitioned)."""
    try:
        schema = rows_table(rows).schema
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types in a column: each slice types its own
        return {}
    return {field.name: field.type for field in schema if not pa.types.is_null(field.type)}


def _const_read(rows: list[dict], types: dict[str, pa.DataType]) -> Callable[[], Iterator[pa.Table]]:
    def read():
        table = rows_table(rows)
        for i, field in enumerate(table.schema):
            if pa.types.is_null(field.type) and field.name in types:
                table = table.set_column(i, pa.field(field.name, types[field.name]),
                                         table.column(i).cast(types[field.name]))
        yield table

    return read


def range_datasource(n: int) -> Datasource:
    def plan(slots: int, override: int | None, target_bytes: int) -> list[ReadTask]:
        return [ReadTask(f"range[{lo}:{hi}]", 8 * (hi - lo), _range_read(lo, hi), f"range[{lo}:{hi}]")
                for lo, hi in row_ranges(n, 8, slots, override, target_bytes)]

    return Datasource("Range", plan, num_rows=n)


def _range_read(lo: int, hi: int) -> Callable[[], Iterator[pa.Table]]:
    def read():
        for start in range(lo, hi, READ_BATCH_ROWS):
            yield pa.table({"id": pa.array(range(start, min(hi, start + READ_BATCH_ROWS)), pa.int64())})

    return read
