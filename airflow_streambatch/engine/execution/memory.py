"""The memory budget and everything that spends it, in one place.

Memory is the bytes of blocks that exist and are not yet consumed (``used``) plus
what running tasks are expected to write (``reserved``), under
``DataContext.memory_limit``. Three things move it:

* `BlockLedger`: a block produced counts as used until every reference to its file
  is released (slices of one block share its file), then the file is deleted;
* reservations: a launch reserves each task's estimated output (the scheduling
  policy sizes it, `policies.py`);
* `MemoryGrants`: a running task writes blocks past its reservation only with a
  grant (`worker/streams.py`), given most downstream first; when nothing can move
  otherwise, the guard grants one block over the limit rather than deadlock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from airflow_streambatch.engine.execution.block_access import BlockAccess
from airflow_streambatch.engine.execution.stream_watcher import StreamWatcher, WatchedTask
from airflow_streambatch.engine.protocol.blocks import BlockRef

log = logging.getLogger("airflow_streambatch.engine.progress")

STALL_S = 1.0  # nothing moved for this long while tasks wait for memory: grant one block anyway


@dataclass
class MemoryBudget:
    limit: int
    used: int = 0  # bytes of blocks produced and not yet released
    reserved: float = 0.0  # estimated output of running tasks
    peak: int = 0

    def room(self) -> float:
        """Bytes neither held by blocks nor reserved by running tasks."""
        return max(0.0, self.limit - self.used - self.reserved)

    def unreserve(self, nbytes: float) -> None:
        self.reserved = max(0.0, self.reserved - nbytes)


class BlockLedger:
    """Which operator owns each live block, and how many references share each file.

    Consumers release blocks from their own thread (``iter_batches``), so every
    change to ownership or memory holds the ledger's lock.
    """

    def __init__(self, memory: MemoryBudget, operators: list, blocks: BlockAccess | None = None):
        self.memory = memory
        self.operators = operators
        self.blocks = blocks or BlockAccess(None)
        self._lock = threading.Lock()
        self._owner: dict[str, int] = {}  # block_id -> producing operator index
        self._path_refs: dict[str, int] = {}  # block file -> live references (slices share files)

    def add(self, op, ref: BlockRef) -> None:
        with self._lock:
            self._owner[ref.block_id] = op.index
            self._path_refs[ref.path] = self._path_refs.get(ref.path, 0) + 1
            op.output_added(ref.size_bytes)
            self.memory.used += ref.size_bytes
            self.memory.peak = max(self.memory.peak, self.memory.used)

    def holds(self, path: str) -> bool:
        return path in self._path_refs

    def split(self, whole: BlockRef, parts: list[BlockRef]) -> None:
        """A block replaced by slices of it (a limit's first rows, or pieces for several tasks):
        they share its file and owner; bytes no slice covers are freed."""
        with self._lock:
            owner = self._owner.pop(whole.block_id, None)
            if owner is None:
                return
            for part in parts:
                self._owner[part.block_id] = owner
            self._path_refs[whole.path] = self._path_refs.get(whole.path, 1) + len(parts) - 1
            freed = whole.size_bytes - sum(part.size_bytes for part in parts)
            self.operators[owner].output_freed(freed)
            self.memory.used -= freed

    def release(self, ref: BlockRef, delete: bool = True) -> None:
        """One reference is done; the file goes with the last one (``delete=False`` keeps it)."""
        with self._lock:
            owner = self._owner.pop(ref.block_id, None)
            if owner is None:
                return
            self.operators[owner].output_freed(ref.size_bytes)
            self.memory.used -= ref.size_bytes
            left = self._path_refs.get(ref.path, 1) - 1
            if left > 0:
                self._path_refs[ref.path] = left
                return
            self._path_refs.pop(ref.path, None)
        if delete:
            self.blocks.delete(ref)


class MemoryGrants:
    """Streamed blocks and memory grants of running tasks (the driver side of `worker/streams.py`)."""

    def __init__(self, memory: MemoryBudget, streams: StreamWatcher, operators: list, heartbeat,
                 strict: bool = False):
        self.memory = memory
        self.strict = strict  # the policy's: no block past the limit on the strength of inputs still held
        self.streams = streams
        self.operators = operators
        self.heartbeat = heartbeat
        self.delivered: dict[tuple[int, str], set[str]] = {}  # (operator, task key) -> streamed block ids
        self._over_limit_warned = False

    def watch(self, task: WatchedTask) -> None:
        self.streams.watch(task)

    def streamed(self, op_index: int, task_key: str) -> int:
        """Blocks an earlier attempt of this task delivered (a retry skips them)."""
        return len(self.delivered.get((op_index, task_key), ()))

    def take_delivered(self, op_index: int, task_key: str) -> set[str]:
        """The ids of the blocks the task's attempts streamed; forgotten here (the task ended)."""
        return self.delivered.pop((op_index, task_key), set())

    def forget(self, stream: str) -> None:
        """The attempt ended: what it reserved and did not write is free again."""
        self.memory.unreserve(self.streams.forget(stream).reserved)

    def follow(self, emit: Callable, grant: bool = True) -> None:
        """Pass on the blocks running tasks announced, then grant memory to tasks waiting
        for it, most downstream first (they free memory soonest). A task that says it is
        done gives back what it reserved and did not write."""
        for task, ref in self.streams.poll():
            self.delivered.setdefault((task.op_index, task.task_key), set()).add(ref.block_id)
            taken = min(task.reserved, ref.size_bytes)  # the block now counts as used, not reserved
            task.reserved -= taken
            self.memory.unreserve(taken)
            emit(self.operators[task.op_index], ref)
            self.heartbeat.beat()
        for task in self.streams.tasks.values():
            if task.finished and task.reserved:
                self.memory.unreserve(task.reserved)
                task.reserved = 0
                self.heartbeat.beat()
        if grant:
            self._grant()
            self._guard()

    def _grant(self) -> None:
        waiting = self.streams.waiting()
        idle = sum(task.reserved for task in waiting)  # a waiting task writes nothing until granted
        for task in waiting:  # a task says the size of the block it waits to write: the grant is that much
            block = task.waiting_bytes or self.operators[task.op_index].block_estimate(task.input_bytes)
            need = max(float(block), task.reserved)
            frees_as_much = not self.strict and task.written + need <= task.input_bytes
            if frees_as_much or self.memory.used + (self.memory.reserved - idle) + need <= self.memory.limit:
                idle -= task.reserved
                self.memory.reserved += need - task.reserved
                task.reserved = need
                self.streams.grant(task, task.waiting_for + 1)
                self.heartbeat.beat()

    def _guard(self) -> None:
        """When nothing has moved for ``STALL_S`` (no block, no finished task, no grant)
        while tasks wait, no block waits for the consumer and every running task is
        stopped (waiting for a grant, queued behind one, or done writing), the memory is
        taken by inputs that only waiting tasks can free (a limit smaller than what the
        operators need at once): grant one block over the limit rather than deadlock.

        A task still running can always end and free its inputs, however long it takes:
        the guard once fired while a slow consumer ran on a loaded machine and carried
        a conservative run 2-5 blocks over its limit."""
        waiting = self.streams.waiting()
        stopped = {task.name for task in self.streams.held_back(waiting)}
        running = any(not task.finished and task.name not in stopped for task in self.streams.tasks.values())
        if (waiting and not running and self.heartbeat.idle_s() > STALL_S
                and self.operators[-1].buffered_output_bytes == 0):
            if not self._over_limit_warned:
                log.warning("tasks wait for memory under memory_limit (%d bytes) that only waiting tasks can "
                            "free; writing one block over the limit to make progress. "
                            "Raise DataContext.memory_limit or lower target_max_block_size.", self.memory.limit)
                self._over_limit_warned = True
            self.streams.grant(waiting[0], waiting[0].waiting_for + 1)
            self.heartbeat.beat()


class Heartbeat:
    """When a block, a job or a grant last moved: the clock of the stall guards."""

    def __init__(self):
        self.last = time.monotonic()

    def beat(self) -> None:
        self.last = time.monotonic()

    def idle_s(self) -> float:
        return time.monotonic() - self.last
