"""Errors the engine raises, each naming the operator, partition or setting at fault."""

from __future__ import annotations


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


class TaskLaunchError(StreamBatchError):
    """Spark could not run a group of tasks (executor lost, worker crashed)."""
