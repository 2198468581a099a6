"""The host agent (`worker/host_agent.py`) and `transport.read_any`, over real Arrow Flight
servers and real processes (no Spark, no mocks): the agent is one process per host and
driver, serves block files under its block directory only, to holders of the secret,
removes the run directories of runs that ended, and removes everything and exits once
the driver is gone; `read_any` maps a local block, fetches a remote one, and turns a
block no host serves into `BlockLostError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.flight as flight
import pytest
from standalone_cluster import free_port

from airflow_streambatch.engine.execution.control_server import ControlServer
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.worker.blocks import write_block
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.worker.host_agent import ORPHAN_S, ensure_agent, log_file, prepare_run_dir
from airflow_streambatch.engine.worker.owner import process_alive
from airflow_streambatch.engine.worker.transport import BlockLostError, delete_blocks, read_any

def reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):  # not our child, or already reaped
        os.waitpid(pid, os.WNOHANG)


@pytest.fixture()
def agents():
    """Agents a test started: any still running at its end is killed (a failed test leaves none)."""
    started: list[dict] = []
    yield started
    for info in started:
        if process_alive(info["pid"]):
            os.kill(info["pid"], signal.SIGKILL)
            deadline = time.monotonic() + 5
            while process_alive(info["pid"]) and time.monotonic() < deadline:
                time.sleep(0.05)
        reap(info["pid"])


def eventually(condition, timeout: float, what: str) -> float:
    """Seconds until ``condition()`` held; fails after ``timeout``."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"{what} did not happen within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - start


def ticket(token: str, path: str) -> flight.Ticket:
    return flight.Ticket(json.dumps({"token": token, "path": path}).encode())


def private_dir(path) -> str:
    os.mkdir(path, 0o700)
    return str(path)


TABLE = pa.table({"x": list(range(10)), "s": [f"row {i}" for i in range(10)]})


def test_host_agent_serves_blocks_follows_runs_and_exits_with_its_driver(tmp_path, agents):
    block_dir = private_dir(tmp_path / "blocks")
    driver = ControlServer("127.0.0.1")
    try:
        info = driver.info(timeout_s=5)
        driver.start_run("r1")
        driver.start_run("r2")

        # one agent per host and driver, however many tasks start at once
        with ThreadPoolExecutor(4) as pool:
            found = list(pool.map(lambda _: ensure_agent(block_dir, info), range(4)))
        agents.extend(found)
        agent = found[0]
        assert {a["pid"] for a in found} == {agent["pid"]} and process_alive(agent["pid"])
        assert ensure_agent(block_dir, info)["pid"] == agent["pid"]
        assert agent["uri"].startswith("grpc+tcp://127.0.0.1:")
        assert sorted(f for f in os.listdir(block_dir) if f.startswith("agent-")) == [
            f"agent-{driver.driver_id}-{socket.gethostname()}.{ext}" for ext in ("json", "lock", "log")]

        run1, run2, foreign = (os.path.join(block_dir, f"run-{r}") for r in ("r1", "r2", "r3"))
        prepare_run_dir(run1, agent["mark"])
        prepare_run_dir(run2, agent["mark"])
        prepare_run_dir(foreign, "otherhost 1")  # another agent's: never this one's to remove
        assert os.stat(run1).st_mode & 0o777 == 0o700
        block = os.path.join(run1, "0-p00000-0.arrow")
        write_block(TABLE, block)
        write_block(TABLE, os.path.join(run2, "0-p00000-0.arrow"))

        blocks = flight.FlightClient(agent["uri"])
        assert blocks.do_get(ticket(driver.token, block)).read_all().equals(TABLE)
        with pytest.raises(flight.FlightUnauthenticatedError):
            blocks.do_get(ticket("not-the-secret", block)).read_all()

        # paths a request names are trusted by no one: nothing outside the run directories, no link
        outside = private_dir(tmp_path / "outside")
        secret = os.path.join(outside, "secret.arrow")
        write_block(TABLE, secret)
        os.symlink(secret, os.path.join(run1, "0-p00000-1.arrow"))
        os.symlink(outside, os.path.join(block_dir, "run-evil"))
        refused = [os.path.join(run1, "../../etc/passwd"), "/etc/passwd", secret,
                   os.path.join(run1, "0-p00000-1.arrow"), os.path.join(block_dir, "run-evil", "secret.arrow"),
                   os.path.join(run1, "_driver"),
                   os.path.join(block_dir, f"agent-{driver.driver_id}-{socket.gethostname()}.json")]
        for path in refused:
            with pytest.raises(flight.FlightServerError, match="not a block path"):
                blocks.do_get(ticket(driver.token, path)).read_all()
        delete_blocks(agent["uri"], [secret], info)
        delete_blocks(agent["uri"], [os.path.join(block_dir, "run-evil", "secret.arrow")], info)
        delete_blocks(agent["uri"], [os.path.join(run1, "0-p00000-1.arrow")], info)
        assert os.path.exists(secret) and os.path.islink(os.path.join(run1, "0-p00000-1.arrow"))

        delete_blocks(agent["uri"], [block], info)
        assert not os.path.exists(block)
        with pytest.raises(flight.FlightServerError, match="is gone"):
            blocks.do_get(ticket(driver.token, block)).read_all()

        # a run that ended: its directory goes, on this host, link and all (but not what the link names)
        driver.end_run("r1")
        eventually(lambda: not os.path.exists(run1), 3.0, "removing the ended run's directory")
        assert os.path.exists(secret)
        assert os.path.exists(run2) and os.path.exists(foreign) and os.path.islink(os.path.join(block_dir, "run-evil"))
        assert process_alive(agent["pid"])

        os.remove(os.path.join(block_dir, "run-evil"))
        for name in os.listdir(foreign):
            os.remove(os.path.join(foreign, name))
        os.rmdir(foreign)
    finally:
        driver.shutdown()

    # the driver is gone: the agent removes all it owns, its own files, and exits
    waited = eventually(lambda: not process_alive(agent["pid"]), ORPHAN_S + 5, "the orphaned agent exiting")
    reap(agent["pid"])
    assert waited > ORPHAN_S / 2  # it did not give up on the first failed heartbeat
    assert not os.path.exists(block_dir), os.listdir(block_dir)  # empty, so removed


def test_a_killed_agent_is_replaced(tmp_path, agents):
    block_dir = private_dir(tmp_path / "blocks")
    driver = ControlServer("127.0.0.1")
    try:
        info = driver.info(timeout_s=5)
        driver.start_run("r1")
        first = ensure_agent(block_dir, info)
        agents.append(first)
        os.kill(first["pid"], signal.SIGKILL)  # the OOM killer, say: no cleanup
        eventually(lambda: not process_alive(first["pid"]), 5.0, "the agent dying")
        second = ensure_agent(block_dir, info)
        agents.append(second)
        assert second["pid"] != first["pid"] and process_alive(second["pid"])
    finally:
        driver.shutdown()


# -- reading a block wherever it lives -------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A driver, its live run ``r1`` and this host's agent, with one block in the run's directory."""
    block_dir = private_dir(tmp_path_factory.mktemp("served") / "blocks")
    driver = ControlServer("127.0.0.1")
    driver.start_run("r1")
    info = driver.info(timeout_s=5)
    agent = ensure_agent(block_dir, info)
    run_dir = os.path.join(block_dir, "run-r1")
    prepare_run_dir(run_dir, agent["mark"])
    write_block(TABLE, os.path.join(run_dir, "0-p00000-0.arrow"))
    try:
        yield info, agent, run_dir
    finally:
        driver.shutdown()
        if process_alive(agent["pid"]):
            os.kill(agent["pid"], signal.SIGKILL)
            eventually(lambda: not process_alive(agent["pid"]), 5.0, "the agent dying")
        reap(agent["pid"])


def serving(served) -> tuple[ControlInfo, dict, str]:
    """``served``, once its agent is seen alive; else how it ended and what it logged (CI saw
    it gone, once, between two tests of this module, leaving its info file behind)."""
    info, agent, run_dir = served
    if not process_alive(agent["pid"]):
        with contextlib.suppress(ChildProcessError):
            _, status = os.waitpid(agent["pid"], os.WNOHANG)
            signal_text = f", signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else ""
            agent["ended"] = f"wait status {status}{signal_text}"
        with contextlib.suppress(OSError), open(log_file(os.path.dirname(run_dir), info.driver_id)) as f:
            agent["log"] = f.read()[-2000:]
        pytest.fail(f"the module's agent is gone: {agent}")
    return served


def ref_at(path: str, location: str = "", **changes) -> BlockRef:
    return BlockRef(block_id="0:p00000:0", path=path, num_rows=TABLE.num_rows, size_bytes=TABLE.nbytes,
                    producer=("Op", "p00000", 0), partitions=(0,), location=location, **changes)


def test_read_any_maps_a_local_block(served):
    info, agent, run_dir = serving(served)
    path = os.path.join(run_dir, "0-p00000-0.arrow")
    table, moved = read_any(ref_at(path, agent["uri"]), info)
    assert table.equals(TABLE) and moved == 0
    table, moved = read_any(ref_at(path, agent["uri"]).slice(2, 3), info)
    assert table.equals(TABLE.slice(2, 3)) and moved == 0


def test_read_any_fetches_a_block_from_the_host_that_holds_it(served, tmp_path, monkeypatch):
    """On one host every file the agent serves is a file this process sees too; a path
    relative to the agent's working directory (its block directory) is one it does not."""
    info, agent, run_dir = serving(served)
    monkeypatch.chdir(tmp_path)
    path = os.path.join(os.path.basename(run_dir), "0-p00000-0.arrow")
    assert not os.path.exists(path)
    table, moved = read_any(ref_at(path, agent["uri"]), info)
    assert table.equals(TABLE) and moved == TABLE.nbytes
    table, moved = read_any(ref_at(path, agent["uri"]).slice(2, 3), info)
    assert table.equals(TABLE.slice(2, 3)) and moved == TABLE.nbytes


def test_read_any_of_a_block_its_host_does_not_have_is_lost(served):
    info, agent, run_dir = serving(served)
    for path in (os.path.join(run_dir, "0-p00000-9.arrow"), os.path.join(run_dir, "../../nowhere/0-p00000-0.arrow")):
        assert not os.path.exists(path)
        with pytest.raises(BlockLostError, match=re.escape(f"could not be fetched from {agent['uri']}")):
            read_any(ref_at(path, agent["uri"]), info)
    with pytest.raises(BlockLostError, match="FlightUnauthenticatedError"):
        read_any(ref_at(os.path.join(run_dir, "../nowhere.arrow"), agent["uri"]),
                 ControlInfo(info.uri, "not-the-secret", info.driver_id, info.timeout_s))
    with pytest.raises(BlockLostError, match="no host serves it"):
        read_any(ref_at("/nowhere/0-p00000-0.arrow"), info)
    with pytest.raises(BlockLostError, match="no host serves it"):
        read_any(ref_at("/nowhere/0-p00000-0.arrow", agent["uri"]), None)


@pytest.mark.parametrize("host", ["dead port", "silent listener"])
def test_read_any_from_a_host_that_is_gone_is_lost_in_bounded_time(served, host):
    info, agent, run_dir = serving(served)
    control = ControlInfo(info.uri, info.token, info.driver_id, timeout_s=1)
    with contextlib.ExitStack() as stack:
        if host == "dead port":
            location = f"grpc+tcp://127.0.0.1:{free_port()}"
        else:  # accepts connections (the kernel does), never answers
            silent = stack.enter_context(socket.socket())
            silent.bind(("127.0.0.1", 0))
            silent.listen(16)
            location = f"grpc+tcp://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(BlockLostError, match=re.escape(f"could not be fetched from {location}")):
            read_any(ref_at("/nowhere/0-p00000-0.arrow", location), control)
        assert time.monotonic() - start < control.timeout_s + 2
