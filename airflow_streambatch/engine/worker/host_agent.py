"""The host agent: one process per executor host and driver, serving that host's blocks.

Why a process of its own: blocks outlive the Python worker and the Spark task that
wrote them, and on a cluster no other host can read this host's ``/dev/shm``. The
first task of a driver's run on a host starts the agent (`ensure_agent`); it serves
the host's block files to readers elsewhere over Arrow Flight (`transport.py`),
removes files the driver releases, and owns the run directories on its host:

* every second it asks the driver which runs are alive, and removes the block
  directories of the others (a run that ended, a materialized dataset collected);
* when the driver cannot be reached for ``ORPHAN_S`` (it was killed, or its host
  died), it removes all of them and exits, so nothing is left behind in memory;
* with no live run for ``IDLE_EXIT_S`` it exits; the next run starts a new one.

It runs in a session of its own (``start_new_session``), so a killed executor does
not take the blocks other hosts still read with it; it reads its secret from stdin,
never from its command line.
"""

from __future__ import annotations

import contextlib
import fcntl
import hmac
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import replace

import pyarrow as pa
import pyarrow.flight as flight

from airflow_streambatch.engine.atomic_files import atomic_write
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.worker.block_room import check_block_room
from airflow_streambatch.engine.worker.blocks import check_block_dir
from airflow_streambatch.engine.worker.control_client import DriverUnreachableError, call
from airflow_streambatch.engine.worker.listen import listen_on
from airflow_streambatch.engine.worker.owner import OWNER_FILE, owner_mark, process_alive, process_start, this_host

HEARTBEAT_S = 1.0
ORPHAN_S = 10.0
IDLE_EXIT_S = 30.0
START_TIMEOUT_S = 30.0


class BlockServer(flight.FlightServerBase):
    """Serves block files under ``block_dir`` to holders of the driver's secret; over TLS when
    ``tls`` (certificate PEM, key PEM) is given."""

    def __init__(self, host: str, block_dir: str, token: str, port: int = 0, tls: tuple[str, str] | None = None):
        scheme = "grpc+tls" if tls else "grpc+tcp"
        certs = {"tls_certificates": [flight.CertKeyPair(*tls)]} if tls else {}
        super().__init__(f"{scheme}://{host}:{port}", **certs)
        self.uri = f"{scheme}://{host}:{self.port}"
        self.block_dir = os.path.realpath(block_dir)
        self.token = token

    def _request(self, raw: bytes) -> dict:
        try:
            body = json.loads(raw)
        except ValueError:
            raise flight.FlightServerError("malformed request") from None
        if not isinstance(body, dict) or not hmac.compare_digest(str(body.get("token", "")), self.token):
            raise flight.FlightUnauthenticatedError("wrong or missing token")
        return body

    def block_path(self, path) -> str:
        """``path`` if it is a block file of a run directory of ``block_dir``: never a link,
        never anything outside it (a request names paths, and the agent trusts none)."""
        real = os.path.realpath(str(path))
        parent = os.path.dirname(real)
        ok = (os.path.dirname(parent) == self.block_dir and os.path.basename(parent).startswith("run-")
              and real.endswith(".arrow") and real == os.path.abspath(str(path)))
        if not ok:
            raise flight.FlightServerError(f"not a block path: {str(path)[:200]}")
        return real

    def do_get(self, context, ticket):
        path = self.block_path(self._request(ticket.ticket).get("path"))
        try:
            with pa.memory_map(path, "r") as source:
                table = pa.ipc.open_file(source).read_all()
        except FileNotFoundError:
            raise flight.FlightServerError(f"block file {path} is gone") from None
        return flight.RecordBatchStream(table)

    def do_action(self, context, action):
        body = self._request(action.body.to_pybytes())
        if action.type != "delete":
            raise flight.FlightServerError(f"unknown action {action.type!r}")
        for path in body.get("paths", []):
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.block_path(path))
        return []


def _own_run_dirs(block_dir: str, mark: str) -> dict[str, str]:
    """Run id -> directory, for the run directories this agent created on its host."""
    owned = {}
    for name in os.listdir(block_dir):
        path = os.path.join(block_dir, name)
        if not name.startswith("run-") or os.path.islink(path):
            continue
        with contextlib.suppress(OSError), open(os.path.join(path, OWNER_FILE)) as f:
            if f.read() == mark:
                owned[name[len("run-"):]] = path
    return owned


def serve(block_dir: str, host: str, control: ControlInfo) -> None:
    """The agent's life: serve, follow the driver's live runs, clean up, exit."""
    heartbeat = replace(control, timeout_s=ORPHAN_S)
    tls = None
    if control.tls_roots:  # the driver speaks TLS: so does its agent, with a certificate the driver signs
        try:
            issued = call(heartbeat, "agent_cert", {"host": host})
        except (DriverUnreachableError, flight.FlightUnauthenticatedError):
            _remove_agent_files(block_dir, control.driver_id)  # the driver died while this agent started
            return
        tls = (issued["cert"], issued["key"])
    server = listen_on(lambda port: BlockServer(host, block_dir, control.token, port, tls), host,
                       control.agent_ports, "DataContext.agent_ports")
    mark = owner_mark()
    info_path = agent_file(block_dir, control.driver_id)
    atomic_write(info_path, json.dumps({"uri": server.uri, "pid": os.getpid(),
                                        "start": process_start(os.getpid()), "mark": mark}))
    last_live = time.monotonic()
    try:
        while True:
            try:
                live = set(call(heartbeat, "agent", {})["live_runs"])
            except (DriverUnreachableError, flight.FlightUnauthenticatedError):
                return  # the driver is gone: nobody will read these blocks again
            owned = _own_run_dirs(block_dir, mark)
            for run_id, path in owned.items():
                if run_id not in live:
                    shutil.rmtree(path, ignore_errors=True)
            if live:
                last_live = time.monotonic()
            elif time.monotonic() - last_live > IDLE_EXIT_S:
                return
            time.sleep(HEARTBEAT_S)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(info_path)  # first: a task that looks for the agent from now on starts a new one
        for path in _own_run_dirs(block_dir, mark).values():
            shutil.rmtree(path, ignore_errors=True)
        _remove_agent_files(block_dir, control.driver_id)
        server.shutdown()


def _remove_agent_files(block_dir: str, driver_id: str) -> None:
    for leftover in (lock_file(block_dir, driver_id), log_file(block_dir, driver_id)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(leftover)
    with contextlib.suppress(OSError):
        os.rmdir(block_dir)  # only when empty: other drivers' blocks stay


def _agent_name(block_dir: str, driver_id: str, suffix: str) -> str:
    """Named by driver and host: a block_dir that several hosts share holds one agent per host."""
    return os.path.join(block_dir, f"agent-{driver_id}-{this_host()}.{suffix}")


def agent_file(block_dir: str, driver_id: str) -> str:
    return _agent_name(block_dir, driver_id, "json")


def lock_file(block_dir: str, driver_id: str) -> str:
    return _agent_name(block_dir, driver_id, "lock")


def log_file(block_dir: str, driver_id: str) -> str:
    return _agent_name(block_dir, driver_id, "log")


def advertised_host(driver_uri: str) -> str:
    """The address other hosts reach this one at: ``$SPARK_LOCAL_IP`` when set (as Spark
    uses it), else the address of the interface that routes to the driver."""
    if os.environ.get("SPARK_LOCAL_IP"):
        return os.environ["SPARK_LOCAL_IP"]
    driver_host = driver_uri.rsplit("//", 1)[-1].rsplit(":", 1)[0]
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((driver_host, 9))  # no packet is sent: this only picks the route
        return probe.getsockname()[0]
    return socket.gethostname()


def _running(info_path: str) -> dict | None:
    try:
        with open(info_path) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    alive = process_alive(info["pid"]) and process_start(info["pid"]) == info["start"]
    return info if alive else None


def ensure_agent(block_dir: str, control: ControlInfo, memory_limit: int = 0, block_bytes: int | None = None) -> dict:
    """This host's agent for the driver (started if none runs); returns its ``uri`` and the
    ``mark`` of the run directories it owns. Before starting one, checks that ``block_dir``
    has room for what a task of a run with ``memory_limit`` and blocks of ``block_bytes``
    needs here (`block_room.check_block_room`)."""
    check_block_dir(block_dir)
    info_path = agent_file(block_dir, control.driver_id)
    if (info := _running(info_path)) is not None:
        return info
    lock_path = lock_file(block_dir, control.driver_id)
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # one starter per host; the others find its file
            try:
                current = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if not current:
                continue  # an exiting agent removed this lock file while we waited: take the new one
            if (info := _running(info_path)) is not None:
                return info
            if memory_limit:
                check_block_room(block_dir, memory_limit, f"executor host {this_host()}", block_bytes)
            return _start(block_dir, control, info_path)
        finally:
            os.close(fd)


def _start(block_dir: str, control: ControlInfo, info_path: str) -> dict:
    with contextlib.suppress(FileNotFoundError):
        os.remove(info_path)  # left by a dead agent
    log_path = log_file(block_dir, control.driver_id)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=log, stderr=log,
                                env=env, cwd=block_dir, start_new_session=True)
    config = {"block_dir": block_dir, "host": advertised_host(control.uri), "control": control.__dict__}
    proc.stdin.write(json.dumps(config).encode())
    proc.stdin.close()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if (info := _running(info_path)) is not None:
            return info
        time.sleep(0.05)
    proc.kill()
    tail = ""
    with contextlib.suppress(FileNotFoundError), open(log_path, errors="replace") as f:  # gone: it saw the driver die
        tail = f.read()[-2000:]
    raise RuntimeError(f"the host agent for block directory {block_dir} did not start within {START_TIMEOUT_S:.0f} s "
                       f"(exit code {proc.poll()}): {tail}")


def prepare_run_dir(run_dir: str, mark: str) -> None:
    """Create this host's directory of a run, 0700 and marked as the agent's, if it is not there."""
    try:
        os.mkdir(run_dir, 0o700)
    except FileExistsError:
        return
    atomic_write(os.path.join(run_dir, OWNER_FILE), mark)


if __name__ == "__main__":
    settings = json.loads(sys.stdin.read())
    serve(settings["block_dir"], settings["host"], ControlInfo(**settings["control"]))
