"""Task output streams as both sides name them: `StreamId`, and the grant values they exchange.

Why a type: the driver watches one stream per attempt of a task (`execution/stream_watcher.py`)
and must know which launch (Spark job) an attempt runs in to preempt it (`execution/liveness.py`);
the task names its stream in every record and grant request (`worker/streams.py`). The id is
built once, by the launcher, and its parts are read as fields, never parsed back out of text.
Its wire form is the string ``<op_index>-<task_key>-<launch_id>@<run_id>`` (`str`,
`StreamId.parse`): the run's id in it, since one control server serves a process's runs one
after another, and a task of a failed run still running must not write into the stream of
the same task and launch of the next run (seen: the next run stopped with
`ForgedStreamRecordError`, the old task's block being in the old run's directory).

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
    run_id: str = ""

    def __str__(self) -> str:
        name = f"{self.op_index}-{self.task_key}-{self.launch_id}"
        return f"{name}@{self.run_id}" if self.run_id else name

    @classmethod
    def parse(cls, name: str) -> StreamId:
        """The id a wire name stands for; ``ValueError`` for a name no launch gave out."""
        name, at, run_id = name.rpartition("@") if "@" in name else (name, "", "")
        op_index, sep, rest = name.partition("-")
        task_key, sep2, launch_id = rest.rpartition("-")
        if not (sep and sep2 and task_key) or (at and not run_id):
            raise ValueError(f"not a task stream name (<op_index>-<task_key>-<launch_id>@<run_id>): {name!r}")
        return cls(int(op_index), task_key, int(launch_id), run_id)


@dataclass(frozen=True)
class StreamRecord:
    """One record a task sends on its stream, exactly one of: a block it wrote (``block``, the
    `BlockRef` wire form, checked by the driver before it is trusted), a wait before writing
    block ``wait`` of ``nbytes``, or ``done`` after writing that many blocks."""

    block: dict | None = None
    wait: int | None = None
    nbytes: int = 0
    done: int | None = None

    @classmethod
    def written(cls, ref_wire: dict) -> StreamRecord:
        return cls(block=ref_wire)

    @classmethod
    def waiting(cls, index: int, nbytes: int) -> StreamRecord:
        return cls(wait=index, nbytes=nbytes)

    @classmethod
    def finished(cls, blocks: int) -> StreamRecord:
        return cls(done=blocks)

    def to_wire(self) -> dict:
        if self.wait is not None:
            return {"wait": self.wait, "bytes": self.nbytes}
        if self.done is not None:
            return {"done": self.done}
        return {"block": self.block}

    @classmethod
    def from_wire(cls, record: dict) -> StreamRecord:
        """The record a task sent; ``ValueError`` for one that is none of the three."""
        if "wait" in record:
            return cls.waiting(int(record["wait"]), max(0, int(record.get("bytes", 0))))
        if "done" in record:
            return cls.finished(int(record["done"]))
        if isinstance(record.get("block"), dict):
            return cls.written(record["block"])
        raise ValueError(f"not a stream record (block, wait or done): {sorted(record)}")
