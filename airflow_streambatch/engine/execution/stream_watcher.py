"""The driver side of streaming task output (`worker/streams.py` is the task side).

The driver reads each running task's stream file every turn of its loop, passes
each announced block downstream at once, and writes grants. It trusts no path a
stream names: an announced block must be exactly the file the watched task writes.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass

from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.worker.blocks import STREAM_DIR, BlockRef
from airflow_streambatch.engine.worker.files import atomic_write


class ForgedStreamRecordError(StreamBatchError):
    """A task's output stream announced a block that is not the file that task writes."""


@dataclass
class WatchedTask:
    """The driver's view of one running attempt of a streamed task."""

    op_index: int
    task_key: str
    name: str
    granted: int
    reserved: float  # bytes of memory still reserved for blocks it has not yet written
    input_bytes: int  # it may write as much as it reads: its inputs are freed when it ends
    offset: int = 0
    written: int = 0
    waiting_for: int | None = None
    finished: bool = False  # wrote all its blocks; its Spark job may still run other tasks
    after: str | None = None  # the task its Spark partition runs before it, if any
    yielding: bool = False  # told to give its slot back: gets no grant


class StreamWatcher:
    """The driver side: reads announcements of running tasks and writes grants."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.dir = os.path.join(run_dir, STREAM_DIR)
        self.tasks: dict[str, WatchedTask] = {}

    def watch(self, task: WatchedTask) -> None:
        self.tasks[task.name] = task

    def forget(self, name: str) -> WatchedTask:
        """Stop watching a task whose attempt ended; returns its last state."""
        for suffix in (".stream", ".grant"):
            try:
                os.remove(os.path.join(self.dir, name + suffix))
            except FileNotFoundError:
                pass
        return self.tasks.pop(name)

    def poll(self) -> list[tuple[WatchedTask, BlockRef]]:
        """New blocks announced since the last poll, in each task's order."""
        try:
            present = set(os.listdir(self.dir))
        except FileNotFoundError:
            return []
        found = []
        for task in self.tasks.values():
            if f"{task.name}.stream" not in present:
                continue
            fd = os.open(os.path.join(self.dir, f"{task.name}.stream"), os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                f.seek(task.offset)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            task.offset += len(complete)
            for line in complete.splitlines():
                record = json.loads(line)
                if "wait" in record:
                    task.waiting_for = record["wait"]
                    continue
                if "done" in record:
                    task.finished = True
                    continue
                ref = self._announced_block(task, record["block"])
                task.written += ref.size_bytes
                found.append((task, ref))
        return found

    def _announced_block(self, task: WatchedTask, fields: dict) -> BlockRef:
        """The block a record announces, if it is exactly one the task writes: the file
        ``<run_dir>/<op_index>-<task_key>-<index>.arrow``, a regular file, not a link.

        Anything else is forged (the driver would read any file it names into the
        output, then delete it): an error naming the task, and the path is never touched.
        """
        try:
            fields = dict(fields, producer=tuple(fields["producer"]), partitions=tuple(fields["partitions"]))
            ref = BlockRef(**fields)
            index = ref.producer[2]
            ok = (type(index) is int and index >= 0 and ref.producer[1] == task.task_key
                  and ref.block_id == f"{task.op_index}:{task.task_key}:{index}"
                  and ref.path == os.path.join(self.run_dir, f"{task.op_index}-{task.task_key}-{index}.arrow")
                  and all(type(v) is int and v >= 0 for v in (ref.num_rows, ref.size_bytes, ref.offset))
                  and ref.length is None)
        except (KeyError, TypeError, IndexError, ValueError):
            ok = False
        if ok:
            try:
                ok = stat.S_ISREG(os.lstat(ref.path).st_mode)
            except FileNotFoundError:
                pass  # lost since: the right path, rebuilt from lineage when read
        if not ok:
            raise ForgedStreamRecordError(
                f"task {task.task_key} of operator {task.op_index} announced a block that is not a file it "
                f"writes (expected {task.op_index}-{task.task_key}-<index>.arrow, a regular file in "
                f"{self.run_dir}): {json.dumps(fields, default=str)[:300]}. Another process wrote to the run's "
                "stream directory; the run stops without reading or deleting that path.")
        return ref

    def waiting(self) -> list[WatchedTask]:
        """Tasks stopped for want of a grant, most downstream operator first."""
        stuck = [t for t in self.tasks.values()
                 if t.waiting_for is not None and t.waiting_for >= t.granted and not t.yielding]
        return sorted(stuck, key=lambda t: -t.op_index)

    def held_back(self, waiting: list[WatchedTask]) -> list[WatchedTask]:
        """Tasks that write nothing until a grant: the ``waiting`` ones and those queued
        behind a waiting task in their Spark partition. What they reserved is idle."""
        held: dict[str, WatchedTask] = {t.name: t for t in waiting}
        for task in self.tasks.values():  # launch order: a task's predecessor comes first
            if task.after in held and not task.finished:
                held[task.name] = task
        return list(held.values())

    def grant(self, task: WatchedTask, blocks: int) -> None:
        task.granted = blocks
        atomic_write(os.path.join(self.dir, f"{task.name}.grant"), str(blocks))  # the task polls it
