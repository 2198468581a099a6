"""Paths to pyarrow filesystems: local paths, ``s3://``, ``gs://``, ``hdfs://``."""

from __future__ import annotations

import os
import posixpath
from urllib.parse import urlsplit

import pyarrow.fs as pafs

# A file name's last suffix -> the stream codec it names, as Ray infers it (pyarrow's detection,
# plus Snappy, which is read in Hadoop's framing and never written): reads infer a codec from a
# name with it, and writes name a compressed file by it, so they read back
COMPRESSION_SUFFIXES = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4", ".br": "brotli",
                        ".snappy": "snappy"}
OPEN_STREAM_ARGS = ("compression", "buffer_size")  # what ``arrow_open_stream_args`` takes, on reads and writes


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path within it."""
    return pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), path)


def object_store_scheme(fs: pafs.FileSystem) -> str | None:
    """``s3``, ``gs`` or ``az`` for an object store's filesystem, None for the others.

    Object stores have no rename, no append and whole-object writes: output commits and
    write leases take another protocol there (`engine/output/protocols.py`).
    """
    for name, scheme in (("S3FileSystem", "s3"), ("GcsFileSystem", "gs"), ("AzureFileSystem", "az")):
        cls = getattr(pafs, name, None)
        if cls is not None and isinstance(fs, cls):
            return scheme
    return None


def resolve_in(path: str, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """`resolve`, or with ``filesystem`` (Ray Data's ``filesystem=``) the path within it: a URI's
    scheme is dropped (``s3://bucket/key`` is ``bucket/key``), as Ray does."""
    if filesystem is None:
        return resolve(path)
    if "://" in path:
        parts = urlsplit(path)
        path = parts.path if parts.scheme == "file" else parts.netloc + parts.path
    return filesystem, path


def _key(path: str) -> tuple[str, tuple[str, ...]]:
    """A path's filesystem and its components, so that one spelling of a place compares equal to another.

    Local paths (with or without ``file://``) become absolute with symlinks resolved
    where they exist; other URIs compare by scheme, bucket or host, and path.
    """
    if "://" in path and not path.startswith("file://"):
        parts = urlsplit(path)
        inner = posixpath.normpath("/" + parts.path.lstrip("/"))
        return parts.scheme.lower(), (parts.netloc, *[p for p in inner.split("/") if p])
    if path.startswith("file://"):
        path = urlsplit(path).path or "/"
    real = os.path.realpath(os.path.abspath(os.path.expanduser(path)))
    return "file", tuple(p for p in real.split(os.sep) if p)


def check_disjoint(inputs: list[str] | tuple[str, ...], output: str, where: str) -> None:
    """Refuse an output path that is, contains, or lies inside one of the input paths.

    Output inside an input directory is read back as input by the next listing (a
    retry's manifest no longer matches, the next epoch reads it twice); inputs
    inside the output directory are deleted by a full recompute and overwritten by
    a rerun. Either way data is lost or duplicated, so the write never starts.
    """
    out_fs, out_parts = _key(output)
    for path in inputs:
        in_fs, in_parts = _key(path)
        if in_fs != out_fs:
            continue
        if out_parts == in_parts:
            relation = "is the same path as"
        elif out_parts[:len(in_parts)] == in_parts:
            relation = "lies inside"
        elif in_parts[:len(out_parts)] == out_parts:
            relation = "contains"
        else:
            continue
        raise ValueError(
            f"{where}: output path {output!r} {relation} input path {path!r}. Writing there would read the output "
            "back as input or delete and overwrite the inputs: choose an output path outside every input path."
        )


def free_bytes(path: str) -> int:
    """Free bytes for this user on the local filesystem of ``path`` (or of its nearest existing parent)."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    st = os.statvfs(path or "/")
    return st.f_bavail * st.f_frsize
