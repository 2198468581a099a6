"""What a driver sees of its servers on the network after a run (``multihost_job.py`` with
``$STREAMBATCH_TEST_NETWORK``): where its control plane listens, and, for every socket listening
in ``agent_ports`` (the hosts share the network namespace, so every host agent's socket is in
this process's ``/proc/net/tcp``), whether it answers a TLS client trusting the driver's
authority with the secret, and refuses a plaintext client."""

from __future__ import annotations

import ipaddress
import json
import struct

import pyarrow.flight as flight

from airflow_streambatch.engine.network_settings import port_range

LISTEN = "0A"


def _address(hex_address: str) -> str:
    """``/proc/net/tcp[6]``'s address: 32-bit words in host (little-endian) order."""
    raw = b"".join(struct.pack("<I", int(hex_address[i:i + 8], 16)) for i in range(0, len(hex_address), 8))
    address = ipaddress.ip_address(raw)
    mapped = getattr(address, "ipv4_mapped", None)  # gRPC listens on IPv4 addresses with IPv6 sockets
    return str(mapped or address)


def listening(ports: range) -> list[tuple[str, int]]:
    """(IPv4 address, port) of the sockets listening on one of ``ports``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, port = local.split(":")
                if state == LISTEN and int(port, 16) in ports and "." in (text := _address(address)):
                    found.append((text, int(port, 16)))
    return found


def _answers(uri: str, token: str, **tls) -> bool:
    body = json.dumps({"token": token, "paths": []}).encode()
    try:
        list(flight.FlightClient(uri, **tls).do_action(flight.Action("delete", body),
                                                       options=flight.FlightCallOptions(timeout=5)))
        return True
    except flight.FlightError:
        return False


def probe(ctx, spark) -> dict:
    from airflow_streambatch.engine.execution.control_server import control_server

    info = control_server(spark, ctx).info(5)
    agents = {}
    for address, port in listening(port_range(ctx.agent_ports, "agent_ports")):
        agents[port] = {
            "tls": _answers(f"grpc+tls://{address}:{port}", info.token, tls_root_certs=info.tls_roots.encode()),
            "plaintext": _answers(f"grpc+tcp://{address}:{port}", info.token),
        }
    return {"control_uri": info.uri, "agents": agents}
