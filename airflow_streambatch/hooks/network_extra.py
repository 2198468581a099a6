"""The Spark connection's ``network`` extra: the engine's network settings, fixed once for every DAG.

Why in the connection: ports a firewall or a NetworkPolicy opens, and the certificate the
driver presents, are the platform team's, not each DAG author's; the connection is what
that team owns. The extra holds `DataContext` settings by name (docs/network.md)::

    {"network": {"control_ports": "41000-41009", "agent_ports": "42000-42003",
                 "tls_cert_file": "/etc/streambatch/tls.crt", "tls_key_file": "/etc/streambatch/tls.key"}}

Only paths: the private key stays in its file on the driver's host and is read there; it is
never in the connection, on a command line or in a log. A DAG's ``data_context`` may still
override each setting.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.network_settings import NETWORK_SETTINGS


def network_settings(extras: Mapping, conn_id: str | None) -> dict:
    """The checked settings of the connection's ``network`` extra (empty without one)."""
    value = extras.get("network") or {}
    where = f"the network extra of connection {conn_id!r}"
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be a dict of network settings such as {{'control_ports': '41000-41009'}}, "
                         f"got {value!r}")
    unknown = sorted(set(value) - set(NETWORK_SETTINGS))
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {', '.join(map(repr, unknown))}: it takes "
                         f"{', '.join(NETWORK_SETTINGS)} (docs/network.md)")
    return DataContext.check_settings(dict(value), argument=where, parse_strings=True)
