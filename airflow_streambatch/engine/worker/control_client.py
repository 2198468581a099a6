"""The task side of the control plane: calls to the driver's Arrow Flight server.

Why the network and not files: on a cluster a task's host shares no directory with
the driver, so a grant request written to a file there is never seen and the task
waits forever. Executors reach the driver already (client mode needs it), so tasks
send block announcements and grant requests as Flight actions to the server the
driver runs (`execution/control_server.py`), authenticated with the run's secret.

Every call is bounded: a driver that cannot be reached for ``timeout_s`` (it died,
or a network partition) fails the task with an error naming the address and the
setting, instead of leaving it waiting without a word.
"""

from __future__ import annotations

import json
import threading
import time

import pyarrow.flight as flight

from airflow_streambatch.engine.protocol.control import ControlInfo


class DriverUnreachableError(RuntimeError):
    """The driver's control plane did not answer within ``DataContext.control_timeout_s``."""


_clients: dict[str, flight.FlightClient] = {}
_clients_lock = threading.Lock()


def client(uri: str, tls_roots: str = "") -> flight.FlightClient:
    """One Flight client per address and process (a Python worker runs many tasks); a ``grpc+tls://``
    address is verified against ``tls_roots`` only (never the system's authorities, never unverified)."""
    key = f"{uri} {hash(tls_roots)}"
    with _clients_lock:
        if key not in _clients:
            tls = {"tls_root_certs": tls_roots.encode()} if uri.startswith("grpc+tls://") else {}
            _clients[key] = flight.FlightClient(uri, **tls)
        return _clients[key]


RETRYABLE = (flight.FlightUnavailableError, flight.FlightTimedOutError, flight.FlightCancelledError)


def call(info: ControlInfo, action: str, body: dict, wait_s: float = 0.0) -> dict:
    """Run one action on the driver and return its JSON reply; retries while the driver
    cannot be reached, at most ``info.timeout_s`` in all, then raises `DriverUnreachableError`.

    ``wait_s``: how long the driver may hold this call before answering (a grant request);
    one call gets that plus what is left of ``timeout_s``, so a driver that accepts
    connections but never answers fails the task in bounded time too."""
    payload = json.dumps({**body, "token": info.token}).encode()
    deadline = time.monotonic() + info.timeout_s
    delay = 0.05
    while True:
        left = deadline - time.monotonic()
        # a call that blocks on the driver gets its wait on top, so a slow grant is not a dead driver
        options = flight.FlightCallOptions(timeout=max(0.5, min(wait_s + 5.0, left + wait_s)))
        try:
            results = list(client(info.uri, info.tls_roots).do_action(flight.Action(action, payload), options=options))
            return json.loads(results[0].body.to_pybytes()) if results else {}
        except RETRYABLE as exc:
            if time.monotonic() >= deadline:
                raise DriverUnreachableError(
                    f"the driver's control plane at {info.uri} did not answer within {info.timeout_s:.0f} s "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); the driver died or "
                    "this executor cannot reach it. Check that executors can connect to spark.driver.host, or raise "
                    "DataContext.control_timeout_s") from exc
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(1.0, delay * 2)
