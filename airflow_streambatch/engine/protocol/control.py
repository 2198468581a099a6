"""`ControlInfo`: how tasks reach the driver's control plane.

Why a contract: the driver builds it (`execution/control_server.py`, `execution/tls.py`) and
sends it inside every operator payload; tasks, host agents and block transport on the
executors (`worker/control_client.py`, `worker/host_agent.py`, `worker/transport.py`) call
back with it. Neither side's code is needed to name it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ControlInfo:
    """How tasks reach the driver; travels to executors inside the operator payload.

    :param uri: the driver's Flight server, e.g. ``grpc+tcp://10.0.0.5:41234``.
    :param token: the secret every call carries (Spark already ships the task closure
        to executors over its own channel; the token never appears on a command line).
    :param driver_id: names the driver's host agents and the run directories they own.
    :param timeout_s: how long a task keeps trying to reach the driver
        (`DataContext.control_timeout_s`).
    :param tls_roots: PEM of the authorities whose certificates the driver and the host agents
        present (``grpc+tls://``); empty when TLS is off. Public: a certificate is no secret.
    :param agent_ports: the ports a host agent may listen on (`DataContext.agent_ports`).
    """

    uri: str
    token: str = field(repr=False)  # never in a log line or a traceback's repr
    driver_id: str
    timeout_s: float
    tls_roots: str = field(default="", repr=False)
    agent_ports: int | str | None = None
