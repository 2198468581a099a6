"""Streaming task output: blocks leave a running task as they are cut, under the driver's grants.

A task that decodes one video into 200 MiB of frames must not hold all of it until
it finishes (paper section 4.2.1; Ray Data's streaming generators). Blocks are files,
so the protocol is files too, in ``<run_dir>/streams/`` (tmpfs locally, the shared
block directory on a cluster):

* the task appends one JSON line per block it writes to ``<task>.stream``, a
  ``{"wait": i}`` line when it must stop before writing block ``i``, and a
  ``{"done": n}`` line when it has written its ``n`` blocks (in a Spark job that runs
  several tasks one after another in a partition, the job ends much later);
* the driver reads those lines every turn of its loop, passes each block downstream
  at once (the consumer may start before the producer ends), and writes the number
  of blocks the task may write to ``<task>.grant`` when memory allows, or ``YIELD``
  when the task's slot is needed by an operator that frees memory: the task stops
  (`TaskYielded`) and is run again later, skipping the blocks it delivered.

A task may write ``spec.granted`` blocks without asking: the driver gives each task
the blocks its launch estimate already reserved, so tasks whose output is as
expected never wait. ``spec.skip_blocks`` blocks were delivered by an earlier
attempt of the task: a retry regenerates them (streaming repartition is
deterministic) but neither writes nor announces them, so nothing is delivered twice.

The files are created 0600 in the run's 0700 directory, and the driver still trusts no
path a stream names: it reads, returns and deletes the blocks announced there, so an
announced block must be exactly the file the watched task writes (`StreamWatcher.poll`).
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import asdict, dataclass

from airflow_streambatch.engine.blocks import STREAM_DIR, BlockRef
from airflow_streambatch.engine.errors import StreamBatchError
NO_GRANT_LIMIT = 1 << 62  # lineage replays and unstreamed tasks write freely
YIELD = -1  # a grant that tells a waiting task to stop and give its slot back (it is run again later)


class TaskYielded(Exception):
    """Raised in a task the driver preempted while it waited for memory."""


def stream_name(op_index: int, task_key: str, launch_id: int) -> str:
    """One name per attempt: a retried task is launched again, under a new launch id."""
    return f"{op_index}-{task_key}-{launch_id}"


class OutputStream:
    """The task side: waits for grants before writing a block, announces each block written."""

    def __init__(self, run_dir: str, name: str, granted: int, poll_s: float = 0.01):
        self.dir = os.path.join(run_dir, STREAM_DIR)
        self.path = os.path.join(self.dir, f"{name}.stream")
        self.grant_path = os.path.join(self.dir, f"{name}.grant")
        self.granted = granted
        self.poll_s = poll_s
        self.waited_s = 0.0

    def wait_for(self, index: int) -> None:
        """Return once block ``index`` may be written (the driver granted ``index + 1`` blocks)."""
        if index < self.granted:
            return
        self._append({"wait": index})
        start = time.perf_counter()
        while index >= self.granted:
            time.sleep(self.poll_s)
            try:
                with open(self.grant_path) as f:
                    grant = int(f.read() or 0)
                if grant == YIELD:
                    raise TaskYielded(f"preempted before block {index}")
                self.granted = max(self.granted, grant)
            except FileNotFoundError:
                if not os.path.isdir(self.dir):  # the run is over (driver gone or cancelled)
                    raise RuntimeError(f"the run's block directory {self.dir} is gone; stopping") from None
        self.waited_s += time.perf_counter() - start

    def announce(self, ref: BlockRef) -> None:
        self._append({"block": asdict(ref)})

    def finish(self, blocks: int) -> None:
        self._append({"done": blocks})

    def _append(self, record: dict) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:  # one write per line: the driver reads whole lines only
            f.write(json.dumps(record) + "\n")


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
        tmp = os.path.join(self.dir, f"{task.name}.grant.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(str(blocks))
        os.replace(tmp, os.path.join(self.dir, f"{task.name}.grant"))
