"""The ``paths`` and ``shuffle`` arguments of the ``read_*`` functions and the ``path`` of the writes,
checked as Ray Data checks them.

Why a module of its own: Ray Data programs pass ``pathlib.Path`` objects (or lists of
them) wherever a path goes, and shuffle the order of input files with ``shuffle="files"``
or a `FileShuffleConfig`; every reader and writer must treat them alike, and the readers'
listing code (`plan.datasource.list_files`) takes plain strings only.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from dataclasses import dataclass

import numpy as np

PATHS_HELP = "a str, a pathlib.Path (any os.PathLike), or a list of them"


def _as_str(path, where: str, given) -> str:
    if isinstance(path, str):
        return path
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
        if isinstance(path, str):
            return path
    raise ValueError(f"{where}: expected paths to be {PATHS_HELP}, but got {given!r}")


def normalize_paths(paths, where: str) -> str | list[str]:
    """``paths`` of a ``read_*`` call as a string or a list of strings, as given (Ray takes ``str``,
    ``pathlib.Path`` or a list); anything else, or an empty list, is a ``ValueError`` naming ``where``."""
    if isinstance(paths, (str, os.PathLike)):
        return _as_str(paths, where, paths)
    if not isinstance(paths, (list, tuple)):
        raise ValueError(f"{where}: expected paths to be {PATHS_HELP}, but got {paths!r}")
    if not paths:
        raise ValueError(f"{where}: must provide at least one path")
    return [_as_str(path, where, paths) for path in paths]


def normalize_path(path, where: str) -> str:
    """The one output ``path`` of a ``write_*`` call as a string (``str`` or ``os.PathLike``)."""
    if isinstance(path, (str, os.PathLike)):
        return _as_str(path, where, path)
    raise ValueError(f"{where}: expected path to be a str or a pathlib.Path (any os.PathLike), but got {path!r}")


@dataclass
class FileShuffleConfig:
    """Ray Data's ``FileShuffleConfig``: shuffle the order of a read's input files.

    ``seed=None``: a new order on every execution (as ``shuffle="files"``). With a seed
    and ``reseed_after_execution=False``: the same order on every execution; with
    ``reseed_after_execution=True`` (Ray's default): an order per execution, derived from
    the seed and the execution's index (0 for the first run of the dataset, 1 for the
    next...), so two datasets built alike shuffle alike.
    """

    seed: int | None = None
    reseed_after_execution: bool = True

    def __post_init__(self) -> None:
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"FileShuffleConfig: seed must be an integer or None, got {self.seed!r}")
        if not isinstance(self.reseed_after_execution, bool):
            raise ValueError("FileShuffleConfig: reseed_after_execution must be True or False, got "
                             f"{self.reseed_after_execution!r}")

    def get_seed(self, execution_idx: int = 0) -> int | None:
        """The seed of execution ``execution_idx`` (Ray's rule: ``hash((seed, index)) % 2**32``)."""
        if self.seed is None:
            return None
        if self.reseed_after_execution:
            return hash((self.seed, execution_idx)) % (2 ** 32)
        return self.seed


def check_shuffle(shuffle, where: str):
    """``shuffle`` is None, ``"files"`` or a `FileShuffleConfig`, as Ray accepts it."""
    if shuffle is None or shuffle == "files" or isinstance(shuffle, FileShuffleConfig):
        return shuffle
    raise ValueError(f"{where}: invalid value for 'shuffle': {shuffle!r}. Valid values are None, 'files', "
                     "FileShuffleConfig (airflow_streambatch.engine.FileShuffleConfig); to shuffle rows, "
                     "call random_shuffle() on the dataset")


_PREVIEW = contextvars.ContextVar("file_order_preview", default=False)


@contextlib.contextmanager
def previewing_file_order():
    """Plans made inside list their files in the next execution's order without being one: what
    ``input_files()`` needs, so that asking for the files does not change the order a reseeded
    `FileShuffleConfig` gives the next run (Ray's ``input_files`` does not execute the dataset)."""
    token = _PREVIEW.set(True)
    try:
        yield
    finally:
        _PREVIEW.reset(token)


class FileOrder:
    """The order a read lists its files in, execution after execution (``shuffle``)."""

    def __init__(self, shuffle):
        self.shuffle = shuffle
        self.executions = 0

    def __call__(self, items: list) -> list:
        """``items`` (one per file) in this execution's order; each call is one execution, but
        under `previewing_file_order`."""
        index = self.executions
        if not _PREVIEW.get():
            self.executions += 1
        if self.shuffle is None or len(items) < 2:
            return list(items)
        seed = None if self.shuffle == "files" else self.shuffle.get_seed(index)
        ordered = list(items)
        np.random.default_rng(seed).shuffle(ordered)  # as Ray shuffles its file list
        return ordered


def comparable_uri(path: str, filesystem) -> str:
    """``path`` within ``filesystem`` spelled as a URI (``s3://bucket/key`` for ``bucket/key`` in an
    S3 filesystem), so that an output path given with ``filesystem=`` is compared with the inputs."""
    if filesystem is None or "://" in path:
        return path
    from airflow_streambatch.engine.filesystems import object_store_scheme

    scheme = object_store_scheme(filesystem)
    return f"{scheme}://{path.lstrip('/')}" if scheme else path
