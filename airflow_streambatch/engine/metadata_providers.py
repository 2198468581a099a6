"""Ray Data's file metadata providers (``meta_provider=`` of the ``read_*`` functions).

In Ray a provider does two things for a file read: ``expand_paths`` lists the read's files
(with their sizes) when the ``read_*`` function is called, and calling the provider gives each
read task's `BlockMetadata` guess. The base classes implement neither (they raise
`NotImplementedError`, so ``meta_provider=BaseFileMetadataProvider()`` fails the read call, as
in Ray); ``DefaultFileMetadataProvider`` lists directories with this engine's listing rules,
``FastFileMetadataProvider`` passes the paths through without looking at them.

How a read uses one (`provider_listing`): given a provider, a ``read_*`` call lists its input
through ``expand_paths`` right away, as Ray does, and reads what it listed (the engine's own
listing rules, ``file_extensions`` and ``partition_filter`` apply to that list afterwards);
without one, the engine lists when the dataset runs. The per-task `BlockMetadata` guess is not
consulted: this engine sizes read tasks from the listed files itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from airflow_streambatch.engine.block import BlockMetadata
from airflow_streambatch.engine.errors import NoInputFilesError
from airflow_streambatch.engine.plan.datasource import list_files

log = logging.getLogger(__name__)


class FileMetadataProvider:
    """Base: ``provider(paths, **kwargs)`` is the `BlockMetadata` guess for a read task over
    ``paths``; this base implements nothing (`NotImplementedError`), as Ray's does."""

    def _get_block_metadata(self, paths: list[str], **kwargs) -> BlockMetadata:
        raise NotImplementedError(f"{type(self).__name__} does not implement _get_block_metadata")

    def __call__(self, paths: list[str], **kwargs) -> BlockMetadata:
        return self._get_block_metadata(list(paths), **kwargs)


class BaseFileMetadataProvider(FileMetadataProvider):
    """Base of the providers a file read takes: ``expand_paths`` lists ``(path, size)`` pairs
    and ``_get_block_metadata`` guesses a task's metadata; both are left to subclasses
    (`NotImplementedError`), as in Ray."""

    def _get_block_metadata(self, paths: list[str], *, rows_per_file: int | None = None,
                            file_sizes: list[int | None] | None = None) -> BlockMetadata:
        raise NotImplementedError(f"{type(self).__name__} does not implement _get_block_metadata")

    def expand_paths(self, paths: list[str], filesystem=None, partitioning=None,
                     ignore_missing_paths: bool = False) -> Iterator[tuple[str, int | None]]:
        raise NotImplementedError(f"{type(self).__name__} does not implement expand_paths: use "
                                  "DefaultFileMetadataProvider or FastFileMetadataProvider, or implement it")


class DefaultFileMetadataProvider(BaseFileMetadataProvider):
    """Ray's default for file reads: directories are listed (this engine's rules: hidden and
    ``_``-prefixed files skipped), a task's size is the sum of its files' sizes."""

    def _get_block_metadata(self, paths: list[str], *, rows_per_file: int | None = None,
                            file_sizes: list[int | None] | None = None) -> BlockMetadata:
        sizes = list(file_sizes or [])
        known = len(sizes) == len(paths) and all(size is not None for size in sizes)
        return BlockMetadata(num_rows=rows_per_file * len(paths) if rows_per_file is not None else None,
                             size_bytes=int(sum(sizes)) if known else None, input_files=list(paths), exec_stats=None)

    def expand_paths(self, paths: list[str], filesystem=None, partitioning=None,
                     ignore_missing_paths: bool = False) -> Iterator[tuple[str, int | None]]:
        for found in list_files(paths, filesystem=filesystem, ignore_missing=ignore_missing_paths):
            yield found.path, found.size


class FastFileMetadataProvider(DefaultFileMetadataProvider):
    """Ray's provider that skips listing: every path is taken to be a file, of unknown size.
    ``ignore_missing_paths`` cannot be honoured without looking, so it is a `ValueError`, as in Ray."""

    def expand_paths(self, paths: list[str], filesystem=None, partitioning=None,
                     ignore_missing_paths: bool = False) -> Iterator[tuple[str, int | None]]:
        if ignore_missing_paths:
            raise ValueError("`ignore_missing_paths` cannot be set when used with `FastFileMetadataProvider`. "
                             "All paths must exist when using `FastFileMetadataProvider`.")
        log.warning("Skipping expansion of %d path(s). If your paths contain directories or if file size "
                    "collection is required, try rerunning this read with "
                    "`meta_provider=DefaultFileMetadataProvider()`.", len(paths))
        for path in paths:
            yield path, None


class ParquetMetadataProvider(FileMetadataProvider):
    """Ray's default for ``read_parquet``: a task's guess from its files' Parquet footers. This
    engine reads the footers itself (`parquet_meta.py`), so ``read_parquet`` accepts it and does not
    call it; called on its own it gives the files and, with ``file_sizes``, their total size."""

    def _get_block_metadata(self, paths: list[str], *, num_fragments: int | None = None,
                            prefetched_metadata=None, file_sizes: list[int | None] | None = None,
                            **_ignored) -> BlockMetadata:
        sizes = list(file_sizes or [])
        known = len(sizes) == len(paths) and all(size is not None for size in sizes)
        return BlockMetadata(num_rows=None, size_bytes=int(sum(sizes)) if known else None,
                             input_files=list(paths), exec_stats=None)

    def prefetch_file_metadata(self, fragments, **ray_remote_args):
        """Ray's hook to fetch footers ahead; nothing to prefetch here (None, as Ray's base returns)."""
        return None


DefaultParquetMetadataProvider = ParquetMetadataProvider  # Ray's older name

__all__ = [
    "BaseFileMetadataProvider",
    "DefaultFileMetadataProvider",
    "DefaultParquetMetadataProvider",
    "FastFileMetadataProvider",
    "FileMetadataProvider",
    "ParquetMetadataProvider",
]


def check_meta_provider(meta_provider, where: str) -> None:
    """``meta_provider=`` of a ``read_*`` function: a provider or None; anything else is a
    `TypeError` naming the argument."""
    if meta_provider is not None and not isinstance(meta_provider, FileMetadataProvider):
        raise TypeError(f"{where}: meta_provider must be a metadata provider from "
                        "airflow_streambatch.engine.datasource (e.g. DefaultFileMetadataProvider()) or None, "
                        f"got {type(meta_provider).__name__}")


def provider_listing(meta_provider, paths: str | list[str], filesystem=None, partitioning=None,
                     ignore_missing_paths: bool = False) -> str | list[str]:
    """The paths a read reads: ``paths`` as given without a provider (the engine lists them when the
    dataset runs), else what the provider's ``expand_paths`` lists now, as Ray lists at the
    ``read_*`` call (a provider that does not implement it raises `NotImplementedError` here).
    A provider without ``expand_paths`` (a Parquet one) is not a lister: ``paths`` as given."""
    if meta_provider is None or not hasattr(meta_provider, "expand_paths"):
        return paths
    paths = [paths] if isinstance(paths, str) else list(paths)
    listed = [path for path, _size in meta_provider.expand_paths(paths, filesystem, partitioning,
                                                                   ignore_missing_paths=ignore_missing_paths)]
    if not listed:
        raise NoInputFilesError(f"No input files found to read: {type(meta_provider).__name__}.expand_paths "
                                f"listed nothing under {paths}")
    return listed
