"""Network settings a platform team needs (docs/network.md), over real Arrow Flight servers, a real
host agent process and the shared local SparkSession: fixed ports (a busy port of a range is
skipped; a range with none free fails naming the setting), TLS on the wire (a plaintext client
and a client trusting another authority are refused; the secret never appears in the bytes a
proxy between task and driver sees), and a block directory too small for ``memory_limit``
refused at start, naming both settings. The namespaced-cluster run with TLS and fixed ports is
in test_multihost.py (it reuses that module's cluster).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
from ports import free_port_range as free_range

import airflow_streambatch.engine as sb
from airflow_streambatch.engine.execution import control_server as control_module
from airflow_streambatch.engine.execution.control_server import ControlServer, control_server
from airflow_streambatch.engine.execution.tls import server_tls
from airflow_streambatch.engine.filesystems import free_bytes
from airflow_streambatch.engine.worker.block_room import BlockDirTooSmallError
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.worker.blocks import write_block
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.worker.control_client import DriverUnreachableError, call
from airflow_streambatch.engine.worker.host_agent import ensure_agent, prepare_run_dir
from airflow_streambatch.engine.worker.listen import listen_on
from airflow_streambatch.engine.worker.owner import process_alive
from airflow_streambatch.engine.worker.transport import BlockLostError, read_any


TABLE = pa.table({"x": [1, 2, 3]})


def tls_server(**kwargs) -> ControlServer:
    return ControlServer("127.0.0.1", tls=server_tls("127.0.0.1", "test"), **kwargs)


# -- fixed ports ---------------------------------------------------------------------------------------

def test_a_busy_port_of_the_range_is_skipped_and_a_full_range_fails_naming_the_setting():
    ports = free_range(3)
    spec = f"{ports[0]}-{ports[-1]}"
    with socket.socket() as squatter:  # something else holds the first port
        squatter.bind(("127.0.0.1", ports[0]))
        squatter.listen()
        first = listen_on(lambda p: ControlServer("127.0.0.1", port=p), "127.0.0.1", spec, "DataContext.control_ports")
        second = listen_on(lambda p: ControlServer("127.0.0.1", port=p), "127.0.0.1", spec, "DataContext.control_ports")
        try:
            assert (first.port, second.port) == (ports[1], ports[2])
            assert first.uri == f"grpc+tcp://127.0.0.1:{ports[1]}"
            with pytest.raises(OSError, match=rf"no free port for DataContext.control_ports='{spec}' on 127.0.0.1: "
                                              rf"port\(s\) {ports[0]}, {ports[1]}, {ports[2]} are in use"):
                listen_on(lambda p: ControlServer("127.0.0.1", port=p), "127.0.0.1", spec, "DataContext.control_ports")
        finally:
            first.shutdown()
            second.shutdown()


def test_port_settings_are_checked_like_every_setting():
    assert sb.DataContext.check_settings({"control_ports": "41000-41009", "agent_ports": 42000, "tls": False})
    for bad in ("41009-41000", "41000-", 0, 70000, True, "any"):
        with pytest.raises(ValueError, match=r"data_context\['control_ports'\] must be None \(any free port\), a port"):
            sb.DataContext.check_settings({"control_ports": bad})
    with pytest.raises(ValueError, match=r"DataContext.tls must be True"):
        sb.DataContext(tls="yes")
    ctx = sb.DataContext.check_settings('{"agent_ports": "42000-42003", "tls": "False"}', parse_strings=True)
    assert ctx == {"agent_ports": "42000-42003", "tls": False}


# -- TLS on the wire ---------------------------------------------------------------------------------

class RecordingProxy:
    """A raw TCP proxy on 127.0.0.1: forwards each connection to ``target`` and keeps every byte it saw."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.seen = bytearray()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                downstream, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
                for a, b in ((downstream, upstream), (upstream, downstream)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                with self._lock:
                    self.seen += data
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._listener.close()


@pytest.mark.parametrize("tls", [True, False])
def test_the_secret_crosses_the_wire_only_inside_tls(tls):
    server = tls_server() if tls else ControlServer("127.0.0.1")
    proxy = RecordingProxy(server.port)
    try:
        server.start_run("run-seen-on-the-wire")
        info = server.info(timeout_s=10)
        via_proxy = ControlInfo(info.uri.replace(f":{server.port}", f":{proxy.port}"), info.token, info.driver_id,
                                10, info.tls_roots)
        assert call(via_proxy, "agent", {}) == {"live_runs": ["run-seen-on-the-wire"]}
        assert len(proxy.seen) > 0
        # plaintext: the proxy reads the secret and the reply; TLS: neither
        assert (info.token.encode() in proxy.seen) is (not tls)
        assert (b"run-seen-on-the-wire" in proxy.seen) is (not tls)
    finally:
        proxy.close()
        server.shutdown()


def test_a_plaintext_client_and_a_client_trusting_another_authority_are_refused():
    server = tls_server()
    try:
        info = server.info(timeout_s=1)
        assert info.uri.startswith("grpc+tls://127.0.0.1:") and "BEGIN CERTIFICATE" in info.tls_roots
        plaintext = ControlInfo(info.uri.replace("grpc+tls", "grpc+tcp"), info.token, info.driver_id, 1)
        with pytest.raises(DriverUnreachableError):
            call(plaintext, "agent", {})
        stranger_roots = server_tls("127.0.0.1", "another driver").roots_pem.decode()
        impostor_check = ControlInfo(info.uri, info.token, info.driver_id, 1, stranger_roots)
        with pytest.raises(DriverUnreachableError):
            call(impostor_check, "agent", {})
        assert call(info, "agent", {}) == {"live_runs": []}
    finally:
        server.shutdown()


def test_a_host_agent_serves_blocks_over_tls_on_a_port_of_agent_ports(tmp_path, monkeypatch):
    ports = free_range(2)
    block_dir = str(tmp_path / "blocks")
    os.mkdir(block_dir, 0o700)
    server = tls_server(agent_ports=f"{ports[0]}-{ports[1]}")
    agent = None
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", ports[0]))
        squatter.listen()
        try:
            server.start_run("r1")
            info = server.info(timeout_s=5)
            agent = ensure_agent(block_dir, info)
            assert agent["uri"] == f"grpc+tls://127.0.0.1:{ports[1]}"  # the busy first port was skipped
            run_dir = os.path.join(block_dir, "run-r1")
            prepare_run_dir(run_dir, agent["mark"])
            write_block(TABLE, os.path.join(run_dir, "0-p00000-0.arrow"))
            monkeypatch.chdir(tmp_path)  # relative to the agent's directory, not ours: read_any fetches it
            remote = BlockRef(block_id="0:p00000:0", path="run-r1/0-p00000-0.arrow", num_rows=3,
                              size_bytes=TABLE.nbytes, producer=("Op", "p00000", 0), partitions=(0,),
                              location=agent["uri"])
            assert not os.path.exists(remote.path)
            table, moved = read_any(remote, info)
            assert table.equals(TABLE) and moved == TABLE.nbytes
            with pytest.raises(BlockLostError):  # the agent speaks TLS only
                read_any(remote, ControlInfo(agent["uri"].replace("grpc+tls", "grpc+tcp"), info.token, "", 2))
        finally:
            server.shutdown()
            if agent is not None and process_alive(agent["pid"]):
                os.kill(agent["pid"], signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(agent["pid"], 0)


# -- the driver's control plane in a real run, and the block directory's room ----------------------------

# In a driver of its own: a run of the test session's driver may still hold its control plane (a
# materialized dataset keeps its run until it is dropped), and then no other settings may take over.
RESTART_JOB = """
import sys
from pyspark.sql import SparkSession
import airflow_streambatch.engine as sb
from airflow_streambatch.engine.execution.control_server import control_server
from airflow_streambatch.engine.spark.session import with_spark_defaults

ports, block_dir = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[2]").config(map=with_spark_defaults({"spark.ui.enabled": "false"}))
         .getOrCreate())
ctx = sb.DataContext.get_current()
with ctx.scoped(block_dir=block_dir, progress_interval_s=0, control_ports=ports, tls=True):
    rows = sb.range(40, override_num_blocks=8).map(lambda r: {"id": r["id"] * 2}).take_all()
    assert sorted(r["id"] for r in rows) == [2 * i for i in range(40)], rows
    print("TLS", control_server(spark).uri)
with ctx.scoped(block_dir=block_dir, progress_interval_s=0, tls=False):
    assert len(sb.range(10).take_all()) == 10
    print("PLAIN", control_server(spark).uri)
"""


def test_a_run_uses_tls_and_a_fixed_control_port_and_restarts_the_plane_when_they_change(tmp_path):
    ports = free_range(2)
    job = subprocess.run([sys.executable, "-c", RESTART_JOB, f"{ports[0]}-{ports[1]}", str(tmp_path / "blocks")],
                         capture_output=True, text=True, timeout=240)
    assert job.returncode == 0, job.stderr[-3000:]
    said = dict(line.split(" ", 1) for line in job.stdout.splitlines() if line.startswith(("TLS ", "PLAIN ")))
    assert said["TLS"].startswith("grpc+tls://") and said["TLS"].endswith(f":{ports[0]}")  # the range's first port
    assert said["PLAIN"].startswith("grpc+tcp://")  # the plane restarted with the run's other settings


def test_a_block_dir_smaller_than_the_memory_limit_fails_at_start_naming_both(ctx, tmp_path):
    free = free_bytes(str(tmp_path))
    too_much = free + (1 << 30)
    started = time.monotonic()
    with ctx.scoped(memory_limit=too_much), pytest.raises(BlockDirTooSmallError) as raised:
        sb.range(10).take_all()
    message = str(raised.value)
    assert f"DataContext.block_dir={ctx.block_dir!r}" in message
    assert f"DataContext.memory_limit={too_much}" in message and "emptyDir" in message
    assert time.monotonic() - started < 30
    assert not [d for d in os.listdir(ctx.block_dir) if d.startswith("run-")] if os.path.isdir(ctx.block_dir) else True


def test_an_executor_host_checks_its_block_dir_before_starting_its_agent(tmp_path):
    block_dir = str(tmp_path / "blocks")
    server = tls_server()
    try:
        too_much = free_bytes(str(tmp_path)) + (1 << 30)  # two blocks of this size do not fit
        with pytest.raises(BlockDirTooSmallError, match=r"on executor host .*target_max_block_size=.*memory_limit="):
            ensure_agent(block_dir, server.info(timeout_s=5), memory_limit=4 * too_much, block_bytes=too_much)
        assert not [f for f in os.listdir(block_dir) if f.endswith(".json")]  # no agent was started
    finally:
        server.shutdown()


def test_the_control_plane_keeps_its_settings_while_a_run_uses_it(spark, ctx):
    server = control_server(spark)
    server.start_run("still-going")
    try:
        with pytest.raises(RuntimeError, match=r"control_ports, agent_ports, tls.*hold for a whole driver process"):
            control_server(spark, ctx.copy(tls=not ctx.tls))
    finally:
        server.end_run("still-going")
    assert control_module._server is server


# -- a certificate of the platform's own ---------------------------------------------------------------

def _self_signed(tmp_path, host: str) -> tuple[str, str]:
    """A self-signed certificate for ``host`` and its key, as a platform's PKI would hand them out."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "platform driver")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = tmp_path / "driver.crt", tmp_path / "driver.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    os.chmod(key_file, 0o600)
    return str(cert_file), str(key_file)


def test_the_driver_presents_a_given_certificate_and_agents_still_get_theirs(tmp_path):
    import pyarrow.flight as flight

    from airflow_streambatch.engine.worker.host_agent import BlockServer

    cert_file, key_file = _self_signed(tmp_path, "127.0.0.1")
    server = ControlServer("127.0.0.1", tls=server_tls("127.0.0.1", "d", cert_file, key_file))
    try:
        info = server.info(timeout_s=5)
        assert open(cert_file).read().strip() in info.tls_roots  # executors trust the platform's certificate
        assert call(info, "agent", {}) == {"live_runs": []}
        issued = call(info, "agent_cert", {"host": "127.0.0.1"})  # what a host agent asks for
        agent = BlockServer("127.0.0.1", str(tmp_path), info.token, 0, (issued["cert"], issued["key"]))
        try:
            client = flight.FlightClient(agent.uri, tls_root_certs=info.tls_roots.encode())
            body = flight.Action("delete", ('{"token": "%s", "paths": []}' % info.token).encode())
            assert list(client.do_action(body)) == []  # the agent's certificate verifies against the roots
        finally:
            agent.shutdown()
    finally:
        server.shutdown()
    with pytest.raises(ValueError, match=r"DataContext.tls_cert_file is set but DataContext.tls_key_file is not"):
        server_tls("127.0.0.1", "d", cert_file, None)
    with pytest.raises(ValueError, match=r"DataContext.tls_key_file '/nonexistent.key' is not a readable file"):
        server_tls("127.0.0.1", "d", cert_file, "/nonexistent.key")


def test_an_agent_whose_driver_dies_before_it_has_a_certificate_leaves_nothing(tmp_path, monkeypatch):
    """The driver is killed while an agent starts (asks for its certificate): the agent gives up
    after ``ORPHAN_S`` like an agent whose heartbeat goes unanswered, and removes its files."""
    from airflow_streambatch.engine.worker import host_agent

    block_dir = str(tmp_path / "blocks")
    os.mkdir(block_dir, 0o700)
    server = tls_server()
    info = server.info(timeout_s=30)  # a task's patience: the agent must not wait that long
    server.shutdown()
    for path in (host_agent.lock_file(block_dir, info.driver_id), host_agent.log_file(block_dir, info.driver_id)):
        open(path, "w").close()  # what the task that started the agent made
    monkeypatch.setattr(host_agent, "ORPHAN_S", 1.0)
    started = time.monotonic()
    host_agent.serve(block_dir, "127.0.0.1", info)
    assert time.monotonic() - started < 10
    assert not os.path.exists(block_dir)
