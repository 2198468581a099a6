"""Errors the engine raises, each naming the operator, partition or setting at fault."""

from __future__ import annotations

import errno
from dataclasses import dataclass


class StreamBatchError(Exception):
    """Base class of every error the engine raises on purpose."""


class UserCodeError(StreamBatchError):
    """A user function raised (or returned something unusable) inside a task.

    Carries the operator, the input partitions the failing task descends from and
    the remote traceback, because the driver-side stack says nothing useful.
    """

    def __init__(self, operator: str, partitions: tuple[int, ...], message: str, remote_traceback: str = ""):
        self.operator = operator
        self.partitions = partitions
        self.remote_traceback = remote_traceback
        where = ", ".join(str(p) for p in partitions) or "?"
        text = f"{operator} failed on input partition(s) {where}: {message}"
        if remote_traceback:
            text += "\n--- remote traceback ---\n" + remote_traceback.rstrip()
        super().__init__(text)


class LineageError(StreamBatchError):
    """A lost block could not be rebuilt (its producer is unknown or not deterministic)."""


@dataclass(frozen=True)
class PartitionFailure:
    """One input partition that failed for good, and why."""

    partition: int
    label: str
    operator: str
    error: str
    traceback: str = ""

    def describe(self) -> str:
        return f"partition {self.partition} ({self.label}) in {self.operator}: {self.error}"


class PartitionsFailedError(StreamBatchError):
    """More input partitions failed than ``DataContext.max_failed_partitions`` allows."""

    def __init__(self, failures: list[PartitionFailure], allowed: int):
        self.failures = failures
        lines = "\n".join(f"  - {f.describe()}" for f in failures)
        super().__init__(
            f"{len(failures)} input partition(s) failed (DataContext.max_failed_partitions={allowed}):\n{lines}\n"
            f"Other partitions were not affected; raise max_failed_partitions to let a run finish anyway."
        )


class PartialResultWarning(UserWarning):
    """A consumer's result lacks the rows of input partitions that failed.

    Raised as a warning (``max_failed_partitions`` allowed the failures); turn it
    into an error with ``warnings.simplefilter("error", PartialResultWarning)``.
    """


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a write that found no space left (tasks report it; the driver decides)."""
    return getattr(exc, "errno", None) == errno.ENOSPC or "No space left on device" in str(exc)


def check_positive_int(value, what: str, *, allow_zero: bool = False, allow_none: bool = False) -> None:
    """Raise `ValueError` naming ``what`` (the setting or argument) and ``value`` unless ``value`` is an
    integer >= 1 (>= 0 with ``allow_zero``; ``None`` passes with ``allow_none``). Booleans are not integers here.

    The one check behind every count the engine takes (block counts, batch sizes, concurrency,
    ``DataContext`` sizes), so they all refuse the same values with the same kind of message.
    """
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        wanted = "an integer >= 0" if allow_zero else "a positive integer"
        raise ValueError(f"{what} must be {wanted}{' or None' if allow_none else ''}, got {value!r}")
