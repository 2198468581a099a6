"""What every ``read_*`` function shares, with Ray Data's names and defaults.

``filesystem=`` (a `pyarrow.fs.FileSystem` the paths are resolved in, instead of by
their URI scheme), ``partitioning=`` (columns from ``key=value`` directories, or
named directory levels), compression inferred from the file name or given with
``arrow_open_stream_args={"compression": ...}``, ``include_paths=``,
``ignore_missing_paths=``, ``file_extensions=`` and ``partition_filter=`` (which
files to read, by the partition values in their paths). A `FileOptions` travels to the
executors inside each read task's closure, so everything in it pickles (pyarrow
filesystems do).
"""

from __future__ import annotations

import enum
import io
import posixpath
import urllib.parse
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from airflow_streambatch.engine.filesystems import COMPRESSION_SUFFIXES, OPEN_STREAM_ARGS, resolve_in

CODECS = frozenset(COMPRESSION_SUFFIXES.values())
_STREAM_ARGS = frozenset(OPEN_STREAM_ARGS)
_PARTITION_TYPES = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}


class PartitionStyle(str, enum.Enum):
    """Ray Data's ``ray.data.datasource.PartitionStyle``: ``HIVE`` (``"hive"``) or ``DIRECTORY``
    (``"dir"``). A `str` enum, as Ray's, so ``Partitioning("hive")`` and
    ``Partitioning(PartitionStyle.HIVE)`` are the same scheme."""

    HIVE = "hive"
    DIRECTORY = "dir"


@dataclass(frozen=True)
class Partitioning:
    """Ray Data's path-based partition scheme (``ray.data.datasource.Partitioning``).

    ``"hive"``: every directory named ``key=value`` (one ``=``) below ``base_dir`` gives
    a column ``key``; values are URL-decoded strings unless ``field_types`` maps the key
    to ``int``, ``float`` or ``bool``. ``"dir"``: the directory levels below
    ``base_dir`` are the values of ``field_names``, in order. A file outside
    ``base_dir`` has no partition columns.
    """

    style: str = "hive"
    base_dir: str | None = None
    field_names: list[str] | None = None
    field_types: dict[str, type] | None = field(default=None)
    filesystem: pafs.FileSystem | None = None

    def __post_init__(self) -> None:
        if self.style not in ("hive", "dir"):
            raise ValueError(f"Partitioning: style={self.style!r} is not 'hive' or 'dir'")
        object.__setattr__(self, "style", PartitionStyle(self.style))  # "hive" and PartitionStyle.HIVE alike
        if self.style == "dir" and not self.field_names:
            raise ValueError("Partitioning('dir') needs field_names: the names of the directory levels, in order")
        for name, kind in (self.field_types or {}).items():
            if kind not in _PARTITION_TYPES:
                raise ValueError(f"Partitioning: field_types[{name!r}]={kind!r} is not one of int, float, str, bool")

    def __call__(self, path: str, typed: bool = True) -> dict:
        """The partition values of one file's path ({} when it has none); strings unless
        ``typed`` (then cast by ``field_types``)."""
        path = strip_scheme(path)
        base = strip_scheme(self.base_dir).rstrip("/") if self.base_dir else ""
        if base:
            if not path.startswith(base + "/"):
                return {}
            path = path[len(base) + 1:]
        dirs = [d for d in posixpath.dirname(path).split("/") if d]
        if self.style == "hive":
            pairs = [d.split("=") for d in dirs if d.count("=") == 1]
            values = {key: urllib.parse.unquote(value) for key, value in pairs}
            if self.field_names and values and list(values) != list(self.field_names):
                raise ValueError(f"{path}: partition keys {list(values)} are not field_names {self.field_names}")
        else:
            if dirs and len(dirs) != len(self.field_names):
                raise ValueError(f"{path}: {len(dirs)} directory level(s) {dirs}, but Partitioning('dir') has "
                                 f"{len(self.field_names)} field_names {self.field_names}")
            values = {name: value for name, value in zip(self.field_names, dirs) if name is not None}
        for name, kind in (self.field_types or {}).items() if typed else ():
            if name in values:
                values[name] = _cast(values[name], kind, name, path)
        return values


class PathPartitionFilter:
    """Ray Data's ``ray.data.datasource.PathPartitionFilter``: which files a read keeps.

    ``filter_fn`` gets each file's partition values as strings, as its path spells them
    (``{}`` for a file outside any partition), and returns whether to read the file.
    The files are chosen when the read lists its input, in the driver: a skipped file is
    never opened. ``filter_fn=None`` keeps every file, as in Ray.
    """

    def __init__(self, partitioning: Partitioning, filter_fn):
        if filter_fn is not None and not callable(filter_fn):
            raise TypeError(f"PathPartitionFilter: filter_fn must be callable or None, got "
                            f"{type(filter_fn).__name__}")
        self.parser = partitioning
        self.filter_fn = filter_fn

    @staticmethod
    def of(filter_fn=None, style: str = "hive", base_dir: str | None = None, field_names: list[str] | None = None,
           field_types: dict[str, type] | None = None, filesystem=None) -> PathPartitionFilter:
        return PathPartitionFilter(Partitioning(style, base_dir, field_names, field_types, filesystem), filter_fn)

    def __call__(self, paths: list[str]) -> list[str]:
        if self.filter_fn is None:
            return list(paths)
        return [path for path in paths if self.filter_fn(self.parser(path, typed=False))]


def _same_as_file(column: pa.Array, found: pa.ChunkedArray, name: str, value, path: str) -> pa.Array:
    """The partition's column in the type of the file's column of its name, checked equal to it."""
    try:
        column = column.cast(found.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"{path}: partition column {name} exists in the file as {found.type}, and the path's "
                         f"value {value!r} is not one: {exc}") from exc
    if len(column) and not pc.all(pc.equal(column, found)).as_py():
        raise ValueError(f"{path}: Partition column {name} exists in table data, but partition value "
                         f"'{value}' is different from in-data values: {found.unique().to_pylist()}.")
    return column


def _cast(value: str, kind: type, name: str, path: str):
    if kind is bool:
        return value.lower() == "true"
    try:
        return kind(value)
    except ValueError as exc:
        raise ValueError(f"{path}: partition value {name}={value!r} is not {kind.__name__}") from exc


def strip_scheme(path: str) -> str:
    """A URI's path as a `pyarrow.fs.FileSystem` names it: ``s3://bucket/key`` is ``bucket/key``."""
    if "://" not in path:
        return path
    parts = urllib.parse.urlsplit(path)
    return parts.path if parts.scheme == "file" else parts.netloc + parts.path


@dataclass(frozen=True)
class FileOptions:
    """The file options of one ``read_*`` call, checked; ``where`` names the function in errors."""

    where: str
    filesystem: pafs.FileSystem | None = None
    partitioning: Partitioning | None = None
    include_paths: bool = False
    ignore_missing_paths: bool = False
    file_extensions: tuple[str, ...] | None = None
    compression: str | None = None
    buffer_size: int | None = None
    partition_filter: PathPartitionFilter | None = None

    def listing(self) -> dict:
        """`list_files` keyword arguments."""
        return {"filesystem": self.filesystem, "ignore_missing": self.ignore_missing_paths,
                "extensions": self.file_extensions, "keep": self.partition_filter}

    def open_file(self, path: str):
        """A random-access handle (Parquet footers, byte ranges of lines)."""
        fs, inner = resolve_in(path, self.filesystem)
        return fs.open_input_file(inner)

    def codec(self, path: str) -> str | None:
        """The codec a file is read with: the one given, else its name's suffix's, else None."""
        if self.compression is not None:
            return self.compression
        return COMPRESSION_SUFFIXES.get(posixpath.splitext(path.lower())[1])

    def open_stream(self, path: str):
        """A handle on the file's decompressed bytes."""
        fs, inner = resolve_in(path, self.filesystem)
        codec = self.codec(path)
        if codec == "snappy":  # not an Arrow stream codec: decoded whole, in memory, as Ray does
            with fs.open_input_stream(inner) as raw:
                return pa.BufferReader(snappy_file(raw.read(), path))
        return fs.open_input_stream(inner, compression=codec, buffer_size=self.buffer_size)

    def check_splittable(self, path: str) -> None:
        codec = self.codec(path)
        if codec is not None:
            raise ValueError(f"{path} is {codec}-compressed, so it cannot be read in byte ranges; keep it whole "
                             "(max_partition_bytes=None, or a name ending in its codec's suffix)")

    def finish(self, table: pa.Table, path: str, keep_file_columns: bool = False) -> pa.Table:
        """The table with its partition columns and, with ``include_paths``, its ``path`` column.

        A file column of a partition's name keeps the file's type, as Ray's file readers keep
        it: the path's value, cast to that type, must equal every value in the file, or the
        read fails naming the file, the column and both values. With ``keep_file_columns``
        (Parquet) the file's column is kept unchecked, as Ray's Parquet reader keeps it.
        """
        if self.partitioning is not None:
            types = self.partitioning.field_types or {}
            for name, value in self.partitioning(path).items():
                column = pa.array([value] * table.num_rows, _PARTITION_TYPES[types.get(name, str)])
                index = table.schema.get_field_index(name)
                if index < 0:
                    table = table.append_column(name, column)
                elif not keep_file_columns:
                    checked = _same_as_file(column, table.column(index), name, value, path)
                    table = table.set_column(index, name, checked)
        if self.include_paths:
            table = table.append_column("path", pa.array([path] * table.num_rows, pa.string()))
        return table

    def constant_columns(self, path: str, file_columns: list[str]) -> list[tuple[pa.Field, pa.Scalar]]:
        """The columns `finish(keep_file_columns=True)` adds to a table of ``path``, as typed constants:
        a Parquet read hands them to pyarrow's scan, so that ``columns=`` and a filter can use them."""
        types = (self.partitioning.field_types or {}) if self.partitioning is not None else {}
        values = self.partitioning(path) if self.partitioning is not None else {}
        if self.include_paths and "path" not in values:
            values = {**values, "path": path}
        found = []
        for name, value in values.items():
            if name not in file_columns:
                kind = _PARTITION_TYPES[types.get(name, str)]
                found.append((pa.field(name, kind), pa.scalar(value, kind)))
        return found


SNAPPY_FRAMED = b"\xff\x06\x00\x00sNaPpY"  # the stream identifier chunk of Snappy's framing format


def snappy_file(data: bytes, path: str) -> bytes:
    """A ``.snappy`` file's bytes, in either framing Ray reads: Snappy's framing format (what
    ``python-snappy``'s ``stream_compress`` writes; Ray reads it with python-snappy, as here)
    or, without its stream identifier, Hadoop's block framing (Ray's framing on HDFS)."""
    if not data.startswith(SNAPPY_FRAMED):
        return hadoop_snappy(data)
    try:
        import snappy
    except ImportError as exc:
        raise ImportError(f"{path} is in Snappy's framing format, which is read with python-snappy, as Ray "
                          "reads it: pip install python-snappy") from exc
    out = io.BytesIO()
    try:
        snappy.stream_decompress(src=io.BytesIO(data), dst=out)
    except Exception as exc:  # python-snappy's errors are its own types (UncompressError, ...)
        raise ValueError(f"{path}: corrupt Snappy framing-format stream: {exc}") from exc
    return out.getvalue()


def hadoop_snappy(data: bytes) -> bytes:
    """Decompress Hadoop's Snappy framing: blocks of (4-byte big-endian raw length, then chunks of
    4-byte big-endian compressed length and a raw Snappy chunk) until the block's length is reached."""
    codec, out, pos = pa.Codec("snappy"), [], 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise ValueError("truncated Hadoop Snappy stream (a block length is cut)")
        remaining, pos = int.from_bytes(data[pos:pos + 4], "big"), pos + 4
        while remaining > 0:
            size, pos = int.from_bytes(data[pos:pos + 4], "big"), pos + 4
            chunk, pos = data[pos:pos + size], pos + size
            if len(chunk) != size:
                raise ValueError("truncated Hadoop Snappy stream (a chunk is cut)")
            piece = codec.decompress(chunk, decompressed_size=_varint(chunk)).to_pybytes()
            out.append(piece)
            remaining -= len(piece)
    return b"".join(out)


def _varint(data: bytes) -> int:
    """The uncompressed length a raw Snappy chunk starts with."""
    value = shift = 0
    for byte in data[:5]:
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value
        shift += 7
    raise ValueError("corrupt Snappy chunk (its length header does not end)")


def file_options(where: str, *, filesystem=None, partitioning=None, include_paths=False, ignore_missing_paths=False,
                 file_extensions=None, arrow_open_stream_args=None, partition_filter=None) -> FileOptions:
    """Check the shared arguments of ``where`` (a ``read_*`` function) and bundle them."""
    if filesystem is not None and not isinstance(filesystem, pafs.FileSystem):
        raise TypeError(f"{where}: filesystem must be a pyarrow.fs.FileSystem, got {type(filesystem).__name__}")
    if partitioning is not None and not isinstance(partitioning, Partitioning):
        raise TypeError(f"{where}: partitioning must be an airflow_streambatch.engine.datasource.Partitioning "
                        f"or None, got {type(partitioning).__name__}")
    for name, value in (("include_paths", include_paths), ("ignore_missing_paths", ignore_missing_paths)):
        if not isinstance(value, bool):
            raise TypeError(f"{where}: {name} must be True or False, got {value!r}")
    extensions = None
    if file_extensions is not None:
        if isinstance(file_extensions, str) or not all(isinstance(e, str) and e.strip(".") for e in file_extensions):
            raise TypeError(f"{where}: file_extensions must be a list of extensions such as ['csv', 'csv.gz'], "
                            f"got {file_extensions!r}")
        extensions = tuple(e.lower().lstrip(".") for e in file_extensions)
    args = dict(arrow_open_stream_args or {})
    if not isinstance(arrow_open_stream_args or {}, dict) or set(args) - _STREAM_ARGS:
        raise ValueError(f"{where}: arrow_open_stream_args supports only {sorted(_STREAM_ARGS)}, got "
                         f"{arrow_open_stream_args!r}")
    compression = args.get("compression")
    if compression is not None and compression not in CODECS:
        raise ValueError(f"{where}: arrow_open_stream_args compression={compression!r} is not one of {sorted(CODECS)}")
    if partition_filter is not None and not isinstance(partition_filter, PathPartitionFilter):
        raise TypeError(f"{where}: partition_filter must be an airflow_streambatch.engine.datasource."
                        f"PathPartitionFilter or None, got {type(partition_filter).__name__}")
    return FileOptions(where, filesystem, partitioning, include_paths, ignore_missing_paths, extensions,
                       compression, args.get("buffer_size"), partition_filter)


HIVE = Partitioning("hive")  # Ray's default for read_parquet, read_csv and read_json
TEXT_DEFAULTS = FileOptions("read_text")  # read_text's defaults: no partition columns, no path column
