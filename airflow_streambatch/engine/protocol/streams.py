"""Task output streams as both sides name them: `StreamId`, and the grant values they exchange.

Why a type: the driver watches one stream per attempt of a task (`execution/stream_watcher.py`)
and must know which launch (Spark job) an attempt runs in to preempt it (`execution/liveness.py`);
the task names its stream in every record and grant request (`worker/streams.py`). The id is
built once, by the launcher, and its parts are read as fields, never parsed back out of text.
Its wire form is the string ``<op_index>-<task_key>-<launch_id>`` (`str`, `StreamId.parse`).

A grant is a number of blocks a task may write; two values mean more than a count:
``NO_GRANT_LIMIT`` (unwatched tasks and lineage replays write freely) and ``YIELD`` (stop and
give the slot back; the task is run again later, skipping what it delivered).
"""

from __future__ import annotations

from dataclasses import dataclass

NO_GRANT_LIMIT = 1 << 62  # lineage replays and unstreamed tasks write freely
YIELD = -1  # a grant that tells a waiting task to stop and give its slot back (it is run again later)


@dataclass(frozen=True)
class StreamId:
    """One stream per attempt: a retried task is launched again, under a new launch id."""

    op_index: int
    task_key: str
    launch_id: int

    def __str__(self) -> str:
        return f"{self.op_index}-{self.task_key}-{self.launch_id}"

    @classmethod
    def parse(cls, name: str) -> StreamId:
        """The id a wire name stands for; ``ValueError`` for a name no launch gave out."""
        op_index, sep, rest = name.partition("-")
        task_key, sep2, launch_id = rest.rpartition("-")
        if not (sep and sep2 and task_key):
            raise ValueError(f"not a task stream name (<op_index>-<task_key>-<launch_id>): {name!r}")
        return cls(int(op_index), task_key, int(launch_id))
