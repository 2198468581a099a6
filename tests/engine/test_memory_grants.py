"""Memory grants to running tasks: `MemoryGrants`, without Spark, over a real control plane:
tasks' `worker/streams.OutputStream` (the task side) send records to and ask for grants
from a real Arrow Flight `ControlServer`, read by a real `StreamWatcher` (the driver side)."""
from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass

import pytest
from observed_server import ObservedServer

from airflow_streambatch.engine.execution import memory as memory_mod
from airflow_streambatch.engine.execution.control_server import ControlServer
from airflow_streambatch.engine.execution.memory import Heartbeat, MemoryBudget, MemoryGrants
from airflow_streambatch.engine.execution.stream_watcher import StreamWatcher, WatchedTask
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.worker.control_client import call
from airflow_streambatch.engine.protocol.streams import StreamId, YIELD
from airflow_streambatch.engine.worker.streams import OutputStream, TaskYielded


@pytest.fixture(scope="module")
def server():
    control = ObservedServer("127.0.0.1")
    yield control
    control.shutdown()


_launches = itertools.count(1)  # one stream name per task of the module: the server is shared


def told(server: ControlServer, name: str) -> dict:
    """What the driver answers the task now, over the wire: ``{"grant": n}`` or ``{"closed": True}``."""
    return call(server.info(timeout_s=5), "grant", {"stream": name, "index": 0, "wait_s": 0}, wait_s=0)


# -- MemoryGrants -----------------------------------------------------------------------


@dataclass
class GrantOp:
    """What `MemoryGrants` reads of an operator."""

    index: int
    next_block: int = 10
    buffered_output_bytes: int = 0

    def block_estimate(self, input_bytes: int = 0) -> int:
        return self.next_block


class Task:
    """A running task: its `OutputStream` in a thread, blocking in ``wait_for`` like a real task."""

    def __init__(self, server: ObservedServer, run_dir: str, op_index: int, key: str, granted: int = 0):
        self.server = server
        self.op_index, self.key = op_index, key
        self.stream = StreamId(op_index, key, next(_launches))
        self.name = str(self.stream)
        self.out = OutputStream(server.info(timeout_s=5), self.name, granted=granted)
        self.run_dir = run_dir
        self.outcome: str | None = None
        self._thread: threading.Thread | None = None

    def block(self, index: int, size: int) -> BlockRef:
        path = os.path.join(self.run_dir, f"{self.op_index}-{self.key}-{index}.arrow")
        with open(path, "wb") as f:
            f.write(b"x")
        return BlockRef(block_id=f"{self.op_index}:{self.key}:{index}", path=path, num_rows=1, size_bytes=size,
                        producer=("Op", self.key, index), partitions=(0,))

    def write(self, index: int, size: int) -> BlockRef:
        """Write block ``index`` (within what was granted) and announce it."""
        self.out.wait_for(index)
        block = self.block(index, size)
        self.out.announce(block)
        return block

    def start_waiting(self, index: int, nbytes: int = 0) -> None:
        """Ask for block ``index`` (of ``nbytes``, 0: unsaid) in a thread; returns once the
        driver holds the task's wait record and the task asked for its grant."""
        def run():
            try:
                self.out.wait_for(index, nbytes)
                self.outcome = "granted"
            except TaskYielded:
                self.outcome = "yielded"
            except RuntimeError:  # the driver closed the stream
                self.outcome = "closed"

        key = (self.name, index)
        with self.server.asked:
            before = self.server.grant_requests[key]  # this wait, not an earlier one
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        with self.server.asked:
            asked = self.server.asked.wait_for(lambda: self.server.grant_requests[key] > before, timeout=5)
        assert asked, "the task never asked for its grant"

    def join(self, timeout: float = 5.0) -> str | None:
        self._thread.join(timeout)
        return self.outcome

    def stop(self) -> None:
        """Tell a task still waiting to yield (so no thread outlives its test), and close its stream."""
        if self._thread is not None and self._thread.is_alive():
            self.server.set_grant(self.name, YIELD)
            self._thread.join(5)
        self.server.close_stream(self.name)


@pytest.fixture()
def run_dir(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    return str(d)


@pytest.fixture()
def tasks():
    started: list[Task] = []
    yield started
    for task in started:
        task.stop()


def setup_grants(server, run_dir, ops, limit, used=0, strict=False):
    budget = MemoryBudget(limit=limit, used=used)
    watcher = StreamWatcher(run_dir, server)
    grants = MemoryGrants(budget, watcher, ops, Heartbeat(), strict)
    return budget, watcher, grants


def watch(grants, task: Task, reserved: float = 0.0, input_bytes: int = 0, granted: int = 0) -> WatchedTask:
    watched = WatchedTask(task.stream, granted, reserved, input_bytes)
    grants.memory.reserved += reserved
    grants.watch(watched)
    return watched


def never_emit(op, ref):
    raise AssertionError(f"nothing was announced, yet {ref} was emitted")


def test_follow_passes_on_announced_blocks_and_moves_reservation_to_used(server, run_dir):
    ops = [GrantOp(0), GrantOp(1)]
    budget, watcher, grants = setup_grants(server, run_dir, ops, limit=1000)
    task = Task(server, run_dir, 1, "k1", granted=3)
    watched = watch(grants, task, reserved=100, input_bytes=50, granted=3)
    written = [task.write(0, 40), task.write(1, 40)]
    emitted = []
    grants.follow(lambda op, r: emitted.append((op.index, r)))
    assert emitted == [(1, written[0]), (1, written[1])]
    assert watched.reserved == 20 and budget.reserved == 20 and watched.written == 80
    assert grants.streamed(1, "k1") == 2
    task.write(2, 40)  # more than it reserved: only the 20 left is unreserved
    grants.follow(lambda op, r: emitted.append((op.index, r)))
    assert watched.reserved == 0 and budget.reserved == 0 and len(emitted) == 3
    task.out.finish(3)
    grants.follow(never_emit)
    assert watched.finished
    grants.forget(task.name)
    assert task.name not in watcher.tasks and told(server, task.name) == {"closed": True}
    with pytest.raises(RuntimeError, match="no longer runs"):  # the stream is closed: the task stops
        task.out.finish(3)


def test_a_finished_task_gives_back_what_it_did_not_write(server, run_dir, tasks):
    budget, watcher, grants = setup_grants(server, run_dir, [GrantOp(0)], limit=1000)
    task = Task(server, run_dir, 0, "p00000", granted=5)
    tasks.append(task)
    watched = watch(grants, task, reserved=300, granted=5)
    task.write(0, 100)
    task.out.finish(1)
    grants.follow(lambda op, r: None)
    assert watched.finished and watched.reserved == 0 and budget.reserved == 0


def test_a_waiting_task_is_granted_when_its_next_block_fits(server, run_dir, tasks):
    ops = [GrantOp(0, next_block=30), GrantOp(1, next_block=30)]
    budget, watcher, grants = setup_grants(server, run_dir, ops, limit=100, used=70)
    task = Task(server, run_dir, 1, "k")
    tasks.append(task)
    watched = watch(grants, task, input_bytes=10)
    task.start_waiting(0)
    grants.follow(never_emit)
    assert task.join() == "granted"
    assert watched.granted == 1 and watched.reserved == 30 and budget.reserved == 30
    assert watcher.waiting() == []


def test_no_grant_when_the_next_block_would_pass_the_limit(server, run_dir, tasks):
    ops = [GrantOp(0, next_block=31)]
    budget, watcher, grants = setup_grants(server, run_dir, ops, limit=100, used=70)
    task = Task(server, run_dir, 0, "p00000")
    tasks.append(task)
    watched = watch(grants, task, input_bytes=0)
    task.start_waiting(0)
    grants.follow(never_emit)
    assert told(server, task.name) == {"grant": 0} and task.outcome is None
    assert watched.granted == 0 and budget.reserved == 0 and watcher.waiting() == [watched]
    budget.used = 69  # a consumer released a block: now it fits
    grants.follow(never_emit)
    assert task.join() == "granted" and watched.granted == 1 and budget.reserved == 31


def test_a_task_is_granted_the_size_of_the_block_it_waits_to_write(server, run_dir, tasks):
    """An 8-byte block once waited for room for a full estimated block (W8 #9)."""
    ops = [GrantOp(0, next_block=50)]
    budget, watcher, grants = setup_grants(server, run_dir, ops, limit=100, used=90)
    task = Task(server, run_dir, 0, "p00000")
    tasks.append(task)
    watched = watch(grants, task)
    task.start_waiting(0, nbytes=8)
    grants.follow(never_emit)
    assert task.join() == "granted" and watched.granted == 1 and budget.reserved == 8


def test_grants_go_most_downstream_first(server, run_dir, tasks):
    ops = [GrantOp(0, next_block=20), GrantOp(1, next_block=20), GrantOp(2, next_block=20)]
    budget, watcher, grants = setup_grants(server, run_dir, ops, limit=100, used=60)
    upstream, downstream, middle = (Task(server, run_dir, i, key) for i, key in ((0, "a"), (2, "b"), (1, "c")))
    tasks.extend([upstream, downstream, middle])
    watched = {t.op_index: watch(grants, t, input_bytes=1) for t in (upstream, downstream, middle)}
    for t in (upstream, downstream, middle):
        t.start_waiting(0)
    grants.follow(never_emit)  # room for two blocks of 20: operators 2 then 1
    assert downstream.join() == "granted" and middle.join() == "granted"
    assert [watched[i].granted for i in (0, 1, 2)] == [0, 1, 1]
    assert budget.reserved == 40
    assert told(server, upstream.name) == {"grant": 0} and upstream.outcome is None


def test_a_task_that_frees_as_much_as_it_writes_is_granted_over_the_limit(server, run_dir, tasks):
    """Its inputs are freed when it ends: writing no more than it read cannot grow memory."""
    ops = [GrantOp(0), GrantOp(1, next_block=50)]
    budget, watcher, grants = setup_grants(server, run_dir, ops, limit=100, used=100)
    task = Task(server, run_dir, 1, "k")
    tasks.append(task)
    watched = watch(grants, task, input_bytes=50)
    task.start_waiting(0)
    grants.follow(never_emit)
    assert task.join() == "granted" and watched.granted == 1
    task.write(0, 50)
    grants.follow(lambda op, r: None)
    task.start_waiting(1)  # 50 written + 50 more > its 50 input: must fit now, and does not
    grants.follow(never_emit)
    assert watched.granted == 1 and task.outcome == "granted" and watcher.waiting() == [watched]


def test_strict_grants_do_not_count_inputs_still_held(server, run_dir, tasks):
    """The conservative policy's: the inputs are freed only when the task ends, so writing as
    much beside them would pass the limit until then (W8 #16, by 76 KiB)."""
    ops = [GrantOp(0), GrantOp(1, next_block=50)]
    budget, watcher, grants = setup_grants(server, run_dir, ops, limit=100, used=100, strict=True)
    task = Task(server, run_dir, 1, "k")
    tasks.append(task)
    watched = watch(grants, task, input_bytes=50)
    task.start_waiting(0, nbytes=50)
    grants.follow(never_emit)
    assert watched.granted == 0 and task.outcome is None and watcher.waiting() == [watched]


def test_a_yielding_task_gets_no_grant(server, run_dir, tasks):
    budget, watcher, grants = setup_grants(server, run_dir, [GrantOp(0)], limit=1000)
    task = Task(server, run_dir, 0, "p00000")
    tasks.append(task)
    watched = watch(grants, task)
    watched.yielding = True
    task.start_waiting(0)
    grants.follow(never_emit)
    assert watched.granted == 0 and told(server, task.name) == {"grant": 0} and task.outcome is None


def stalled(grants) -> None:
    grants.heartbeat.last = time.monotonic() - memory_mod.STALL_S - 1  # nothing moved for longer than STALL_S


def test_the_guard_grants_one_block_over_the_limit_after_a_stall(server, run_dir, tasks, caplog):
    ops = [GrantOp(0, next_block=40), GrantOp(1, next_block=40)]
    budget, watcher, grants = setup_grants(server, run_dir, ops, limit=100, used=100)
    upstream, downstream = Task(server, run_dir, 0, "a"), Task(server, run_dir, 1, "b")
    tasks.extend([upstream, downstream])
    w_up, w_down = watch(grants, upstream, input_bytes=1), watch(grants, downstream, input_bytes=1)
    upstream.start_waiting(0)
    downstream.start_waiting(0)
    grants.follow(never_emit)  # not stalled yet: nobody is granted
    assert (w_up.granted, w_down.granted) == (0, 0)
    stalled(grants)
    with caplog.at_level(logging.WARNING, logger="airflow_streambatch.engine.progress"):
        grants.follow(never_emit)
    assert downstream.join() == "granted"
    assert (w_up.granted, w_down.granted) == (0, 1)  # one block, to the most downstream
    assert any("memory_limit" in r.getMessage() for r in caplog.records)
    assert grants.heartbeat.idle_s() < memory_mod.STALL_S  # the grant counts as progress
    grants.follow(never_emit)  # ... so the guard does not grant again at once
    assert w_up.granted == 0 and told(server, upstream.name) == {"grant": 0} and upstream.outcome is None


def test_the_guard_waits_for_the_stall_time(server, run_dir, tasks):
    budget, watcher, grants = setup_grants(server, run_dir, [GrantOp(0, next_block=40)], limit=100, used=100)
    task = Task(server, run_dir, 0, "a")
    tasks.append(task)
    watched = watch(grants, task)
    task.start_waiting(0)
    grants.heartbeat.last = time.monotonic() - memory_mod.STALL_S / 2
    grants.follow(never_emit)
    assert watched.granted == 0


def test_the_guard_waits_while_the_consumer_has_blocks_to_free(server, run_dir, tasks):
    ops = [GrantOp(0, next_block=40), GrantOp(1, buffered_output_bytes=10)]
    budget, watcher, grants = setup_grants(server, run_dir, ops, limit=100, used=100)
    task = Task(server, run_dir, 0, "a")
    tasks.append(task)
    watched = watch(grants, task)
    task.start_waiting(0)
    stalled(grants)
    grants.follow(never_emit)
    assert watched.granted == 0
    ops[1].buffered_output_bytes = 0
    stalled(grants)
    grants.follow(never_emit)
    assert watched.granted == 1


def test_the_guard_waits_while_another_task_may_still_write(server, run_dir, tasks):
    """A running task that holds a reservation and is not waiting will move memory."""
    ops = [GrantOp(0, next_block=40), GrantOp(1, next_block=40)]
    budget, watcher, grants = setup_grants(server, run_dir, ops, limit=100, used=90)
    waiter, writer = Task(server, run_dir, 0, "a"), Task(server, run_dir, 1, "b", granted=1)
    tasks.append(waiter)
    w_wait = watch(grants, waiter)
    watch(grants, writer, reserved=10, granted=1)
    waiter.start_waiting(0)
    stalled(grants)
    grants.follow(never_emit)
    assert w_wait.granted == 0
    grants.forget(writer.name)  # the writer's attempt ended: its reservation is freed ...
    assert budget.reserved == 0
    stalled(grants)
    grants.follow(never_emit)  # ... and 90 + 40 still does not fit: only the guard can grant
    assert w_wait.granted == 1


def test_follow_without_grant_only_reads(server, run_dir, tasks):
    budget, watcher, grants = setup_grants(server, run_dir, [GrantOp(0)], limit=1000)
    task = Task(server, run_dir, 0, "a")
    tasks.append(task)
    watched = watch(grants, task)
    task.start_waiting(0)
    stalled(grants)
    grants.follow(never_emit, grant=False)
    assert watched.waiting_for == 0 and watched.granted == 0
