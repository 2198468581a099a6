"""The driver side of the control plane: an Arrow Flight server tasks and host agents call.

One per driver process, shared by its runs. It holds, for each running task attempt,
the records the task sent (blocks written, a wait, done) until the scheduler loop
reads them, each exactly once (a task resends a record whose answer it did not get;
records are numbered, and a number already taken is not taken again), and the task's
grant, which a waiting task's ``grant`` call blocks on (`worker/streams.py` is the
task side). Host agents (`worker/host_agent.py`) call
``agent`` every second to learn which runs are still alive: the block directories of
the others are removed on their hosts. Tasks that build stateful UDF instances of an
operator with a concurrency cap ask it for an instance slot (``instance_*`` actions,
`instance_slots.py`), so at most that many instances live at once. A Spark partition that
ran its tasks checks in for more (``check_in``, `check_ins.py`).

Every call must carry the secret made when the server started; the server binds to
the address executors reach the driver at (``spark.driver.host``), on a port of
``DataContext.control_ports`` when set, and speaks TLS unless ``DataContext.tls`` is off
(`tls.py`: the secret then crosses the network only encrypted). Host agents ask it for
their own certificate (``agent_cert``). docs/network.md is the operator's view.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import uuid
from dataclasses import dataclass, field

import pyarrow.flight as flight

from airflow_streambatch.engine.execution.check_ins import CheckInDesk
from airflow_streambatch.engine.execution.instance_slots import InstanceSlots
from airflow_streambatch.engine.execution.tls import ServerTls, server_tls
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.spark.connect import client_address, is_connect
from airflow_streambatch.engine.worker.listen import listen_on

log = logging.getLogger("airflow_streambatch.engine.progress")


@dataclass
class _Stream:
    grant: int
    records: list[dict] = field(default_factory=list)
    received: int = 0  # records taken: a retried call (its answer was lost) carries a number below this


class ControlServer(flight.FlightServerBase):
    """``port``: 0 for any free one (`listen_on` picks one of a range); ``tls``: None serves plaintext."""

    def __init__(self, host: str, bind_host: str | None = None, *, port: int = 0, tls: ServerTls | None = None,
                 driver_id: str | None = None, agent_ports: int | str | None = None):
        scheme = "grpc+tls" if tls is not None else "grpc+tcp"
        certs = {"tls_certificates": [flight.CertKeyPair(tls.cert_pem, tls.key_pem)]} if tls is not None else {}
        super().__init__(f"{scheme}://{bind_host or host}:{port}", **certs)
        self.host = host
        self.uri = f"{scheme}://{host}:{self.port}"
        self.tls = tls
        self.agent_ports = agent_ports
        self.token = secrets.token_hex(16)
        self.driver_id = driver_id or uuid.uuid4().hex[:12]
        self._cond = threading.Condition()
        self._streams: dict[str, _Stream] = {}
        self._live_runs: set[str] = set()
        self.instances = InstanceSlots()
        self.check_ins = CheckInDesk()

    def info(self, timeout_s: float) -> ControlInfo:
        roots = self.tls.roots_pem.decode() if self.tls is not None else ""
        return ControlInfo(self.uri, self.token, self.driver_id, timeout_s, roots, self.agent_ports)

    # -- the scheduler's side ---------------------------------------------------------
    def open_stream(self, name: str, granted: int) -> None:
        with self._cond:
            self._streams[name] = _Stream(granted)

    def close_stream(self, name: str) -> None:
        with self._cond:
            self._streams.pop(name, None)
            self._cond.notify_all()

    def take_records(self, name: str) -> list[dict]:
        """Records a task sent since the last call, in order."""
        with self._cond:
            stream = self._streams.get(name)
            if stream is None or not stream.records:
                return []
            records, stream.records = stream.records, []
            return records

    def set_grant(self, name: str, blocks: int) -> None:
        with self._cond:
            stream = self._streams.get(name)
            if stream is not None:
                stream.grant = blocks
                self._cond.notify_all()

    def start_run(self, run_id: str) -> None:
        with self._cond:
            self._live_runs.add(run_id)

    def busy(self) -> str | None:
        """What still relies on this server (runs, a materialized dataset's blocks, watched task
        outputs), in words; None when nothing does."""
        with self._cond:
            if not (self._live_runs or self._streams):
                return None
            return f"runs {sorted(self._live_runs)} and {len(self._streams)} watched task output(s)"

    def end_run(self, run_id: str) -> None:
        """The run's blocks are no longer needed anywhere: host agents remove them."""
        with self._cond:
            self._live_runs.discard(run_id)
        self.end_instances(run_id)

    def end_instances(self, run_id: str) -> None:
        """The run launches no more tasks: its stateful UDF instances are released where they live."""
        self.instances.end_run(run_id)

    # -- what tasks and agents call ----------------------------------------------------
    def do_action(self, context, action):
        try:
            body = json.loads(action.body.to_pybytes())
        except ValueError:
            raise flight.FlightServerError("malformed request") from None
        if not hmac.compare_digest(str(body.get("token", "")), self.token):
            raise flight.FlightUnauthenticatedError("wrong or missing token")
        handler = {"stream": self._stream, "grant": self._grant, "agent": self._agent,
                   "instance_acquire": self.instances.acquire, "instance_poll": self.instances.poll,
                   "instance_offer": self.instances.offer, "instance_released": self.instances.released,
                   "check_in": self.check_ins.check_in, "agent_cert": self._agent_cert}.get(action.type)
        if handler is None:
            raise flight.FlightServerError(f"unknown action {action.type!r}")
        return [json.dumps(handler(body)).encode()]

    def _stream(self, body: dict) -> dict:
        with self._cond:
            stream = self._streams.get(body["stream"])
            if stream is None:
                return {"closed": True}
            seq = int(body.get("seq", stream.received))
            if seq == stream.received:  # at most once: a block announced twice would be consumed twice
                stream.records.append(body["record"])
                stream.received += 1
            elif seq > stream.received:
                raise flight.FlightServerError(f"stream {body['stream']}: record {seq} before {stream.received}")
            return {"grant": stream.grant}

    def _grant(self, body: dict) -> dict:
        """Block until the stream may write block ``index`` (or must yield), at most ``wait_s``."""
        index, wait_s = int(body["index"]), min(float(body.get("wait_s", 1.0)), 5.0)
        with self._cond:
            self._cond.wait_for(lambda: self._granted_or_gone(body["stream"], index), timeout=wait_s)
            stream = self._streams.get(body["stream"])
            return {"closed": True} if stream is None else {"grant": stream.grant}

    def _granted_or_gone(self, name: str, index: int) -> bool:
        stream = self._streams.get(name)
        return stream is None or stream.grant < 0 or stream.grant > index

    def _agent(self, body: dict) -> dict:
        with self._cond:
            return {"live_runs": sorted(self._live_runs)}

    def _agent_cert(self, body: dict) -> dict:
        """A certificate for a host agent serving at ``host``, with its key: asked over this TLS
        channel with the secret, so the key crosses the network encrypted, to a holder of the secret."""
        if self.tls is None:
            raise flight.FlightServerError("TLS is off on this driver (DataContext.tls=False)")
        cert, key = self.tls.authority.issue(str(body["host"]))
        return {"cert": cert.decode(), "key": key.decode()}


_server: ControlServer | None = None
_server_settings: tuple | None = None
_server_lock = threading.Lock()


def _network_settings(ctx) -> tuple:
    return (ctx.control_ports, ctx.agent_ports, ctx.tls, ctx.tls_cert_file, ctx.tls_key_file, ctx.tls_ca_file)


def control_server(spark, ctx=None) -> ControlServer:
    """This driver's control server, started on first use at the address executors reach
    the driver at (``spark.driver.host``; bound to ``spark.driver.bindAddress`` when set; a
    Spark Connect client's own address, `spark.connect.client_address`),
    with the network settings of ``ctx`` (`DataContext`; the current one when None).
    Without ``spark`` (tasks that run in this process) it is the running server, else one on loopback.

    One per driver process: a run whose network settings differ from the running server's
    restarts it when no run uses it, and fails naming the settings when one does."""
    global _server, _server_settings
    if ctx is None:
        from airflow_streambatch.engine.context import DataContext
        ctx = DataContext.get_current()
    if spark is not None and is_connect(spark):  # the server's driver is not this process: tasks call the client
        host = bind = client_address()
    elif spark is not None:
        conf = spark.sparkContext.getConf()
        host = conf.get("spark.driver.host", "127.0.0.1")
        bind = conf.get("spark.driver.bindAddress", None) or host
    with _server_lock:
        if spark is None:  # tasks in this process reach the server at any address it listens on
            host, bind = _server_settings[-2:] if _server_settings is not None else ("127.0.0.1", "127.0.0.1")
        wanted = (*_network_settings(ctx), host, bind)
        if _server is not None and _server_settings != wanted:
            if (busy := _server.busy()) is not None:
                raise RuntimeError(
                    "this driver's control plane runs with control_ports, agent_ports, tls, tls_cert_file, "
                    f"tls_key_file, tls_ca_file, host, bind address = {_server_settings!r} for {busy} still going "
                    f"(a materialized dataset keeps its run until it is dropped), and this run asks for {wanted!r}: "
                    "these DataContext settings and spark.driver.host/bindAddress hold for a whole driver "
                    "process; run with the same ones")
            _server.shutdown()
            _server = None
        if _server is None:
            driver_id = uuid.uuid4().hex[:12]
            tls = server_tls(host, driver_id, ctx.tls_cert_file, ctx.tls_key_file, ctx.tls_ca_file) if ctx.tls else None
            _server = listen_on(lambda port: ControlServer(host, bind, port=port, tls=tls, driver_id=driver_id,
                                                           agent_ports=ctx.agent_ports),
                                bind, ctx.control_ports, "DataContext.control_ports")
            _server_settings = wanted
            log.debug("control plane listening at %s", _server.uri)
        return _server
