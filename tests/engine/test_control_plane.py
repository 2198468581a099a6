"""The control plane between tasks, host agents and the driver, over real Arrow Flight
servers and real processes (no Spark, no mocks):

* a task's `OutputStream` blocks on the driver's `ControlServer` for its grant, and is
  released, told to yield, or stopped by the driver;
* a task whose driver is gone fails in bounded time, naming the address and the setting;
* a record resent after a lost answer is taken once.

The host agent and block reads are in `test_host_agent.py`.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time

import pyarrow.flight as flight
import pytest
from observed_server import ObservedServer
from standalone_cluster import free_port

from airflow_streambatch.engine.execution.control_server import ControlServer
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.worker.control_client import DriverUnreachableError, call
from airflow_streambatch.engine.protocol.streams import YIELD, StreamId
from airflow_streambatch.engine.worker.streams import GRANT_WAIT_S, OutputStream, TaskYielded


@pytest.fixture(scope="module")
def server():
    control = ObservedServer("127.0.0.1")
    yield control
    control.shutdown()


_launches = itertools.count(1)


def new_stream(server: ControlServer, granted: int = 0) -> OutputStream:
    name = str(StreamId(0, "p00000", next(_launches)))
    server.open_stream(name, granted)
    return OutputStream(server.info(timeout_s=5), name, granted=granted)


def test_a_task_of_an_earlier_run_is_stopped_not_heard_by_the_same_task_of_the_next(server):
    """One control server serves a process's runs in turn: a task of a failed run still running
    names its stream with its run, so the next run's same task and launch never takes its records
    (it did, and stopped with ForgedStreamRecordError)."""
    launch = next(_launches)
    earlier, later = (str(StreamId(0, "p00000", launch, run)) for run in ("run-a", "run-b"))
    server.open_stream(later, 1)
    leftover = OutputStream(server.info(timeout_s=5), earlier, granted=1)
    ref = BlockRef("0:p00000:0", "/run-a/0-p00000-0.arrow", 1, 8, ("Op", "p00000", 0), (0,))
    with pytest.raises(RuntimeError, match="no longer runs task stream"):
        leftover.announce(ref)
    assert server.take_records(later) == []
    server.close_stream(later)


class Waiter:
    """A task thread blocked in ``wait_for(index)``; what ended it, and when."""

    def __init__(self, server: ObservedServer, out: OutputStream, index: int, nbytes: int = 0):
        self.out, self.index, self.nbytes = out, index, nbytes
        self.outcome: str | None = None
        self.error: BaseException | None = None
        self.ended_at: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        server.wait_asked(out.name, index)  # its wait record is with the driver; it blocks on the grant

    def _run(self) -> None:
        try:
            self.out.wait_for(self.index, self.nbytes)
            self.outcome = "granted"
        except BaseException as exc:  # noqa: BLE001 - the test asserts on it
            self.error = exc
            self.outcome = type(exc).__name__
        self.ended_at = time.monotonic()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float) -> str | None:
        self._thread.join(timeout)
        return self.outcome


@pytest.fixture()
def waiters(server):
    """Stops every waiting task thread of a test, even one that failed."""
    started: list[Waiter] = []
    yield started
    for waiter in started:
        server.close_stream(waiter.out.name)
        waiter.join(5)


# -- grants over the wire --------------------------------------------------------------------


def test_a_grant_releases_a_waiting_task(server, waiters):
    out = new_stream(server, granted=0)
    waiter = Waiter(server, out, 3)
    waiters.append(waiter)
    server.wait_asked(out.name, 3, times=2, timeout=GRANT_WAIT_S + 4)  # one request timed out: it asks again
    assert waiter.alive() and server.take_records(out.name) == [{"wait": 3, "bytes": 0}]  # sent once, not per request
    server.set_grant(out.name, 3)  # blocks 0 to 2: block 3 must still wait
    time.sleep(0.3)
    assert waiter.alive() and waiter.outcome is None
    granted_at = time.monotonic()
    server.set_grant(out.name, 4)
    assert waiter.join(5) == "granted"
    assert waiter.ended_at - granted_at < 1.0  # woken by the grant, not by its next request
    assert out.granted == 4
    out.wait_for(3)  # granted: no call, no record
    assert server.take_records(out.name) == []


def test_a_task_writes_its_byte_allowance_without_asking_then_waits(server, waiters):
    """The strict policy gives a task its reservation in bytes: blocks within it need no call;
    the first past it asks, and what was left goes into that grant (never written twice)."""
    name = str(StreamId(0, "p00000", next(_launches)))
    server.open_stream(name, 0)
    out = OutputStream(server.info(timeout_s=5), name, granted=0, allowance=100)
    out.wait_for(0, 60)
    out.wait_for(1, 40)
    assert server.take_records(name) == [] and out.allowance == 0
    out.allowance = 30  # as if a little were left: a 31-byte block still asks, and spends the rest
    waiter = Waiter(server, out, 2, nbytes=31)
    waiters.append(waiter)
    assert server.take_records(name) == [{"wait": 2, "bytes": 31}] and out.allowance == 0
    server.set_grant(name, 3)
    assert waiter.join(5) == "granted"


def test_a_yield_stops_a_waiting_task(server, waiters):
    out = new_stream(server, granted=1)
    waiter = Waiter(server, out, 1)
    waiters.append(waiter)
    told_at = time.monotonic()
    server.set_grant(out.name, YIELD)
    assert waiter.join(5) == "TaskYielded" and isinstance(waiter.error, TaskYielded)
    assert waiter.ended_at - told_at < 1.0


def test_a_closed_stream_stops_a_waiting_task(server, waiters):
    out = new_stream(server)
    waiter = Waiter(server, out, 0)
    waiters.append(waiter)
    closed_at = time.monotonic()
    server.close_stream(out.name)
    assert waiter.join(5) == "RuntimeError" and "no longer runs" in str(waiter.error)
    assert waiter.ended_at - closed_at < 1.0


# -- a task whose driver is gone -------------------------------------------------------------


def dead_uri(how: str) -> str:
    if how == "shut-down server":
        gone = ControlServer("127.0.0.1")
        gone.shutdown()
        return gone.uri
    return f"grpc+tcp://127.0.0.1:{free_port()}"


@pytest.mark.parametrize("how", ["shut-down server", "free port"])
def test_a_task_whose_driver_is_gone_fails_in_bounded_time(how):
    uri = dead_uri(how)
    out = OutputStream(ControlInfo(uri, "secret", "driver", timeout_s=2), "0-p00000-1", granted=0)
    start = time.monotonic()
    with pytest.raises(DriverUnreachableError) as raised:
        out.wait_for(0)
    elapsed = time.monotonic() - start
    assert 1.0 <= elapsed <= 5.0  # it retried for about timeout_s, no longer
    assert uri.rsplit("//", 1)[1] in str(raised.value) and "DataContext.control_timeout_s" in str(raised.value)


def test_a_task_whose_driver_hangs_fails_in_bounded_time():
    with socket.socket() as silent:  # accepts connections (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        uri = f"grpc+tcp://127.0.0.1:{silent.getsockname()[1]}"
        out = OutputStream(ControlInfo(uri, "secret", "driver", timeout_s=2), "0-p00000-1", granted=0)
        start = time.monotonic()
        with pytest.raises(DriverUnreachableError):
            out.announce(BlockRef("0:p00000:0", "/nowhere", 1, 1, ("Op", "p00000", 0), (0,)))
        assert time.monotonic() - start <= 5.0


def test_a_record_resent_after_a_lost_answer_is_taken_once(server):
    """A task whose call timed out after the driver took its record sends it again, with the
    same number: the driver takes it once (a block announced twice would be consumed twice)."""
    name = "0-p00042-9"
    server.open_stream(name, 5)
    try:
        info = server.info(timeout_s=5)
        record = {"done": 0}
        for seq in (0, 0, 1, 1):
            assert call(info, "stream", {"stream": name, "seq": seq, "record": record}) == {"grant": 5}
        assert server.take_records(name) == [record, record]
        with pytest.raises(flight.FlightServerError, match="record 5 before 2"):
            call(info, "stream", {"stream": name, "seq": 5, "record": record})
    finally:
        server.close_stream(name)
