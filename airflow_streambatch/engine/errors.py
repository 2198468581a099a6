"""Errors the engine raises, each naming the operator, partition or setting at fault."""

from __future__ import annotations

import errno
from dataclasses import dataclass, field


def human_bytes(n: float) -> str:
    """``n`` bytes as people read them in messages and stats (``5.9 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


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


class UserCodeException(StreamBatchError):
    """Ray Data's name for "a user function raised": the error a consumer raises when input
    partitions failed because of exceptions in user code (see `partitions_failed`)."""


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
    exception: BaseException | None = field(default=None, compare=False, repr=False)  # the task's own, if it loaded

    def describe(self) -> str:
        return f"partition {self.partition} ({self.label}) in {self.operator}: {self.error}"


class PartitionsFailedError(StreamBatchError):
    """More input partitions failed than ``DataContext.max_failed_partitions`` allows."""

    def __init__(self, failures: list[PartitionFailure], allowed: int):
        self.failures = failures
        self.allowed = allowed
        lines = "\n".join(f"  - {f.describe()}" for f in failures)
        super().__init__(
            f"{len(failures)} input partition(s) failed (DataContext.max_failed_partitions={allowed}):\n{lines}\n"
            f"Other partitions were not affected; raise max_failed_partitions to let a run finish anyway."
        )

    def __reduce__(self):  # pickles (to another process) as it was made, the dual type of `partitions_failed` too
        return partitions_failed, (self.failures, self.allowed)


def partitions_failed(failures: list[PartitionFailure], allowed: int) -> PartitionsFailedError:
    """The error to raise for ``failures``: a `PartitionsFailedError` that, when every failure is one
    exception type from user code, is also an instance of that type and of `UserCodeException`.

    A Ray Data user writes ``with pytest.raises(ValueError)`` or ``except KeyError`` around a
    consumer, and Ray raises an error that is an instance of the UDF's exception type: so does
    this, while still listing every failed partition (partition isolation is kept). The first
    failure's exception is the ``__cause__``, so its traceback is in the chain.
    """
    error = PartitionsFailedError(failures, allowed)
    causes = [f.exception for f in failures]
    kinds = {type(c) for c in causes}
    if None in kinds or len(kinds) != 1:
        error.__cause__ = next((c for c in causes if c is not None), None)
        return error
    kind = kinds.pop()
    if not issubclass(kind, StreamBatchError):
        try:  # a class that is both, as Ray's RayTaskError.as_instanceof_cause() makes
            dual = type(f"PartitionsFailedError[{kind.__name__}]", (PartitionsFailedError, UserCodeException, kind),
                        {"__module__": __name__, "__str__": Exception.__str__})  # KeyError's would quote it
            error = dual(failures, allowed)
        except TypeError:  # an exception type that cannot be a base (layout, __init__ signature)
            pass
    error.__cause__ = causes[0]
    return error


class BatchOutputError(TypeError, ValueError):
    """A user function returned something that is not a batch (an int, a dict of columns of
    different lengths): a `TypeError`, and the `ValueError` Ray raises for it."""


class DatasetLengthError(TypeError, AttributeError):
    """``len(ds)``: a `TypeError`, as ``len()`` of an object without a length raises, and the
    `AttributeError` Ray's ``Dataset.__len__`` raises ("use ds.count()")."""


class FileReadError(OSError, ValueError):
    """A file a read cannot parse (a Parquet file among CSV files): an `OSError`, as this engine
    reports unreadable files, and the `ValueError` Ray raises, with Ray's opening words
    ("Failed to read CSV file: <path>"). Kept through the read task's "cannot read" wrapping."""


class NoInputFilesError(FileNotFoundError, ValueError):
    """A read left with no file to read (nothing under its paths, or every file left out by
    ``file_extensions`` or ``partition_filter``): the `FileNotFoundError` this engine raised
    before, and the `ValueError` Ray raises ("No input files found to read ...")."""


_READ_ERROR_TYPES: dict[type, type] = {}


def read_error(cause: BaseException, message: str) -> OSError:
    """The error a read task raises for a file it could not read: an `OSError` saying ``message``
    (which file, and why) that is also an instance of ``cause``'s type, as Ray raises the reader's
    own error (``pytest.raises(ValueError)``, ``except pyarrow.ArrowInvalid``,
    ``except json.JSONDecodeError`` keep working). A type that cannot be a base with `OSError`
    gives a plain `OSError`; the cause stays the ``__cause__`` either way."""
    kind = type(cause)
    if issubclass(kind, OSError):
        try:
            return kind(message)
        except Exception:  # an OSError subclass with a constructor of its own
            return OSError(message)
    dual = _READ_ERROR_TYPES.get(kind)
    if dual is None:
        try:
            dual = type(f"ReadError[{kind.__name__}]", (OSError, kind),
                        {"__module__": __name__, "__str__": OSError.__str__, "__reduce__": _reduce_read_error,
                         "__init__": OSError.__init__, "_cause_type": kind})
        except TypeError:  # a layout that cannot share a class with OSError's (UnicodeDecodeError)
            dual = OSError
        _READ_ERROR_TYPES[kind] = dual
    return dual(message)


def _reduce_read_error(self):  # pickles (from the executor to the driver) as the same dual type
    return _rebuild_read_error, (self._cause_type, str(self))


def _rebuild_read_error(kind: type, message: str) -> OSError:
    return read_error(kind.__new__(kind), message)


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
