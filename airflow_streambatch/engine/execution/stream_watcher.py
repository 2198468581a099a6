"""The driver side of streaming task output (`worker/streams.py` is the task side).

The driver reads the records each running task sent to the control server
(`control_server.py`) every turn of its loop, passes each announced block downstream
at once, and sets grants. It trusts no block a record names: an announced block must
be exactly one the task writes: a regular file where the driver can see it, and
on another host a path its agent checks again before it serves or removes it.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass

from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.execution.control_server import ControlServer
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.streams import StreamId, StreamRecord


class ForgedStreamRecordError(StreamBatchError):
    """A task's output stream announced a block that is not the file that task writes."""


@dataclass
class WatchedTask:
    """The driver's view of one running attempt of a streamed task; ``stream`` says which
    operator, task and launch (Spark job) it is."""

    stream: StreamId
    granted: int
    reserved: float  # bytes of memory still reserved for blocks it has not yet written
    input_bytes: int  # it may write as much as it reads: its inputs are freed when it ends
    offset: int = 0
    written: int = 0
    waiting_for: int | None = None
    waiting_bytes: int = 0  # bytes of the block it waits to write (0: not said)
    finished: bool = False  # wrote all its blocks; its Spark job may still run other tasks
    after: StreamId | None = None  # the task its Spark partition runs before it, if any
    yielding: bool = False  # told to give its slot back: gets no grant

    @property
    def op_index(self) -> int:
        return self.stream.op_index

    @property
    def task_key(self) -> str:
        return self.stream.task_key

    @property
    def name(self) -> str:
        """Its stream's wire name: what the task's records and grant calls carry."""
        return str(self.stream)


class StreamWatcher:
    """The driver side: reads announcements of running tasks and sets grants."""

    def __init__(self, run_dir: str, server: ControlServer):
        self.run_dir = run_dir
        self.server = server
        self.tasks: dict[str, WatchedTask] = {}

    def watch(self, task: WatchedTask) -> None:
        self.tasks[task.name] = task
        self.server.open_stream(task.name, task.granted)

    def forget(self, name: str) -> WatchedTask:
        """Stop watching a task whose attempt ended; returns its last state."""
        self.server.close_stream(name)
        return self.tasks.pop(name)

    def close_all(self) -> None:
        """The run is over: its streams close, and a task of it still running is told to stop
        (a failed run's were left open, and held the control server busy)."""
        for name in list(self.tasks):
            self.forget(name)

    def poll(self) -> list[tuple[WatchedTask, BlockRef]]:
        """New blocks announced since the last poll, in each task's order."""
        found = []
        for task in self.tasks.values():
            for wire in self.server.take_records(task.name):
                record = self._record(task, wire)
                if record.wait is not None:
                    task.waiting_for, task.waiting_bytes = record.wait, record.nbytes
                    continue
                if record.done is not None:
                    task.finished = True
                    continue
                ref = self._announced_block(task, record.block)
                task.written += ref.size_bytes
                found.append((task, ref))
        return found

    @staticmethod
    def _record(task: WatchedTask, wire: dict) -> StreamRecord:
        try:
            return StreamRecord.from_wire(wire)
        except (TypeError, ValueError) as exc:
            raise ForgedStreamRecordError(f"task {task.task_key} of operator {task.op_index} sent a record that "
                                          f"is not a stream record ({exc}); the run stops") from None

    def _announced_block(self, task: WatchedTask, fields: dict) -> BlockRef:
        """The block a record announces, if it is exactly one the task writes: the file
        ``<run_dir>/<op_index>-<task_key>-<index>.arrow`` on the host named by its location.

        Anything else is forged (the driver would read any file it names into the
        output, then delete it): an error naming the task, and the path is never touched.
        """
        try:
            ref = BlockRef.from_wire(fields)
            if not isinstance(ref.location, str):
                raise TypeError("location")
            index = ref.producer[2]
            ok = (type(index) is int and index >= 0 and ref.producer[1] == task.task_key
                  and ref.block_id == f"{task.op_index}:{task.task_key}:{index}"
                  and ref.path == os.path.join(self.run_dir, f"{task.op_index}-{task.task_key}-{index}.arrow")
                  and all(type(v) is int and v >= 0 for v in (ref.num_rows, ref.size_bytes, ref.offset))
                  and ref.length is None)
        except (KeyError, TypeError, IndexError, ValueError):
            ok = False
        if ok and os.path.lexists(ref.path):  # visible here (local mode, a shared block_dir): a file, not a link
            ok = stat.S_ISREG(os.lstat(ref.path).st_mode)
        if not ok:
            raise ForgedStreamRecordError(
                f"task {task.task_key} of operator {task.op_index} announced a block that is not a file it "
                f"writes (expected {task.op_index}-{task.task_key}-<index>.arrow, a regular file in "
                f"{self.run_dir}): {json.dumps(fields, default=str)[:300]}. Something other than the task sent it "
                "with the run's secret; the run stops without reading or deleting that path.")
        return ref

    def waiting(self) -> list[WatchedTask]:
        """Tasks stopped for want of a grant, most downstream operator first."""
        stuck = [t for t in self.tasks.values()
                 if t.waiting_for is not None and t.waiting_for >= t.granted and not t.yielding]
        return sorted(stuck, key=lambda t: -t.op_index)

    def held_back(self, waiting: list[WatchedTask]) -> list[WatchedTask]:
        """Tasks that write nothing until a grant: the ``waiting`` ones and those queued
        behind a waiting task in their Spark partition. What they reserved is idle."""
        held: dict[StreamId, WatchedTask] = {t.stream: t for t in waiting}
        for task in self.tasks.values():  # launch order: a task's predecessor comes first
            if task.after in held and not task.finished:
                held[task.stream] = task
        return list(held.values())

    def grant(self, task: WatchedTask, blocks: int) -> None:
        task.granted = blocks
        self.server.set_grant(task.name, blocks)  # wakes the task's pending grant call
