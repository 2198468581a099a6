"""Ray Data's file metadata providers (``meta_provider=`` of the ``read_*`` functions).

In Ray a provider lists a read's files and guesses each read task's `BlockMetadata`
before the read, so the planner can size tasks; its answers are hints. This engine lists
files and sizes tasks itself (`plan/datasource.py`), so a ``read_*`` function accepts a
provider and does not consult it: the rows read are the same either way. The classes
still work on their own as Ray's do: ``expand_paths`` lists ``(path, size)`` pairs with
this engine's listing rules, and calling one gives the hint for a group of files.
"""

from __future__ import annotations

from collections.abc import Iterator

from airflow_streambatch.engine.block import BlockMetadata
from airflow_streambatch.engine.plan.datasource import list_files


class FileMetadataProvider:
    """Base: ``provider(paths, rows_per_file=None, file_sizes=None)`` is the `BlockMetadata` hint
    for a read task over ``paths``."""

    def _get_block_metadata(self, paths: list[str], *, rows_per_file: int | None = None,
                            file_sizes: list[int | None] | None = None, **_ignored) -> BlockMetadata:
        sizes = list(file_sizes or [])
        known = len(sizes) == len(paths) and all(size is not None for size in sizes)
        return BlockMetadata(num_rows=rows_per_file * len(paths) if rows_per_file is not None else None,
                             size_bytes=sum(sizes) if known else None, input_files=list(paths), exec_stats=None)

    def __call__(self, paths: list[str], **kwargs) -> BlockMetadata:
        return self._get_block_metadata(list(paths), **kwargs)


class BaseFileMetadataProvider(FileMetadataProvider):
    """Adds ``expand_paths``: the files under ``paths`` with their sizes, in listing order."""

    def expand_paths(self, paths: list[str], filesystem=None, partitioning=None,
                     ignore_missing_paths: bool = False) -> Iterator[tuple[str, int | None]]:
        for found in list_files(paths, filesystem=filesystem, ignore_missing=ignore_missing_paths):
            yield found.path, found.size


class DefaultFileMetadataProvider(BaseFileMetadataProvider):
    """Ray's default for non-Parquet reads."""


class FastFileMetadataProvider(DefaultFileMetadataProvider):
    """Ray's provider that skips per-file size look-ups; here listing works the same either way."""


class ParquetMetadataProvider(FileMetadataProvider):
    """Ray's default for ``read_parquet`` (row counts from the footers); this engine reads footers itself."""


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
    """``meta_provider=`` of a ``read_*`` function: a provider (a hint this engine does not need,
    see the module doc) or None; anything else is a `TypeError` naming the argument."""
    if meta_provider is not None and not isinstance(meta_provider, FileMetadataProvider):
        raise TypeError(f"{where}: meta_provider must be a metadata provider from "
                        "airflow_streambatch.engine.datasource (e.g. DefaultFileMetadataProvider()) or None, "
                        f"got {type(meta_provider).__name__}")
