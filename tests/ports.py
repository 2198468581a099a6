"""Loopback ports for the server processes the tests start: a free one, and waiting until one listens."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    """Return once something accepts connections on 127.0.0.1:``port``; `TimeoutError` naming ``what``
    if ``proc`` (the process that should listen there) exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not listen on port {port} within {timeout:.0f} s") from None
            time.sleep(0.1)


def free_port_range(n: int) -> range:
    """``n`` consecutive loopback ports that are free now (for settings that take a port range)."""
    for _ in range(50):
        base = free_port()
        ports = range(base, base + n)
        if ports.stop > 65536:
            continue
        try:
            for port in ports:
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return ports
    raise RuntimeError(f"no {n} consecutive free loopback ports")
