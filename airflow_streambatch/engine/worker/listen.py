"""Starting a Flight server on a port of a configured range (``control_ports``, ``agent_ports``).

Why a probe before each try: gRPC reports a busy port and every other failure to start
(a bad certificate, an address not on this host) with the same "Server did not start
properly". A plain socket bound to the port first tells the two apart, so a busy port is
skipped and any other failure is raised as it is, not as "no free port".
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from typing import TypeVar

from airflow_streambatch.engine.network_settings import port_range

Server = TypeVar("Server")


def port_free(host: str, port: int) -> bool:
    """Whether ``port`` can be bound on ``host`` now (as gRPC binds it: with ``SO_REUSEADDR``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.closing(socket.socket(family, socket.SOCK_STREAM)) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def listen_on(start: Callable[[int], Server], host: str, ports, setting: str) -> Server:
    """``start(port)`` on the first free port ``ports`` allows (``None``: any, port 0).

    ``setting`` names the setting in the error when every port of the range is taken."""
    allowed = port_range(ports, setting)
    if allowed is None:
        return start(0)
    busy = []
    for port in allowed:
        if not port_free(host, port):
            busy.append(port)
            continue
        try:
            return start(port)
        except Exception:
            if port_free(host, port):
                raise  # not taken: a real failure (certificate, address), not a busy port
            busy.append(port)  # taken between the probe and the start
    raise OSError(f"no free port for {setting}={ports!r} on {host}: port(s) {_spans(busy)} are in use. "
                  f"Widen {setting} (e.g. '{allowed.start}-{allowed.stop + 9}'), or free a port of it")


def _spans(ports: list[int]) -> str:
    if len(ports) > 6:
        return f"{ports[0]}-{ports[-1]} (all {len(ports)})"
    return ", ".join(map(str, ports))
