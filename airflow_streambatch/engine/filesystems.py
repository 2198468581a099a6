"""Paths to pyarrow filesystems: local paths, ``s3://``, ``gs://``, ``hdfs://``."""

from __future__ import annotations

import pyarrow.fs as pafs


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path within it."""
    return pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), path)
