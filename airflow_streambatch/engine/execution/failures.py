"""What a failure means, in words that name the partition, operator, path or setting.

Spark reports a crashed Python worker, a cancelled job and a lost executor as one
opaque ``Py4JJavaError`` of a whole job; the executor turns them into messages a
user can act on. A full block directory is not a partition's fault, so it stops the
run before any partition is failed for it.
"""

from __future__ import annotations

import logging
import os
import pickle
import re

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.errors import StreamBatchError, human_bytes
from airflow_streambatch.engine.filesystems import free_bytes

log = logging.getLogger("airflow_streambatch.engine.progress")

WORKER_CRASHED = "Python worker exited unexpectedly"


def load_exception(data: bytes | None) -> BaseException | None:
    """The user's exception a task pickled (`task_runner.portable_exception`), or None if it does not
    load here (its class is not importable in the driver): the failure's text still says what it was.

    The bytes come from this run's own tasks through Spark's result channel, as the task
    results that carry them do."""
    if data is None:
        return None
    try:
        exc = pickle.loads(data)  # noqa: S301 - produced by this run's tasks, see the docstring
    except Exception:  # noqa: BLE001 - a class missing here, or a custom __reduce__ that fails
        return None
    return exc if isinstance(exc, BaseException) else None


def root_cause(error: BaseException) -> str:
    """The line that says what went wrong in a Spark error (its last ``Name: message``
    line: Python exceptions come wrapped in a JVM stack trace)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    causes = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b.*:", line)]
    return causes[-1] if causes else f"{type(error).__name__}: {lines[0] if lines else ''}"


def job_failure_message(error: BaseException, operator: str, partitions: tuple[int, ...],
                        timeout_s: float | None) -> str:
    """Why the Spark job of one task failed. ``timeout_s`` is set when the executor cancelled it."""
    where = f"input partition(s) {', '.join(map(str, partitions))} of {operator}"
    if timeout_s is not None:
        return (f"the task ran past DataContext.task_timeout_s={timeout_s}s on {where}; its Spark job was "
                "cancelled and its Python worker killed")
    if WORKER_CRASHED in str(error):
        return (f"the Python worker exited unexpectedly while running {where}: the process crashed (os._exit, "
                "a segfault in native code) or was killed (by the kernel's out-of-memory killer, or a signal)")
    return f"Spark job failed on {where}: {root_cause(error)}"


def disk_full_error(path: str, ctx: DataContext, operator: str, partitions: tuple[int, ...]) -> StreamBatchError:
    """The run's error when a task found no space left writing ``path``."""
    in_blocks = os.path.abspath(path or ctx.block_dir).startswith(os.path.abspath(ctx.block_dir))
    where = ctx.block_dir if in_blocks or not path else os.path.dirname(path)
    free = _free_bytes(where)
    message = (f"no space left on the device of {where} while {operator} wrote {path or 'a block'} "
               f"(input partition(s) {', '.join(map(str, partitions))}); {human_bytes(free)} free now. ")
    if in_blocks:
        message += (f"Blocks live in DataContext.block_dir ({ctx.block_dir}) and up to DataContext.memory_limit "
                    f"({human_bytes(ctx.memory_limit)}) of them at once: lower memory_limit below the free space, "
                    "or point block_dir at a larger filesystem. No partition was failed for this.")
    else:
        message += "The output filesystem is full: free space there and rerun with mode='resume'."
    return StreamBatchError(message)


def _free_bytes(path: str) -> int:
    """Free bytes where a write failed, for its error message: 0 when even that cannot be read."""
    try:
        return free_bytes(path)
    except OSError:
        return 0
