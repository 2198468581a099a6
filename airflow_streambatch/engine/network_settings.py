"""The network settings of `DataContext`: fixed ports and TLS of the control plane and host agents.

Why here and not in ``context.py``: the driver (``execution/control_server.py``) and the
host agents on executors (``worker/host_agent.py``) both read port ranges, so the parsing
lives below both layers; ``context.py`` only calls `validate_network_setting`.

A platform team opens a firewall or a Kubernetes NetworkPolicy for known ports only, so
``control_ports`` and ``agent_ports`` take a port (``41000``), a range (``"41000-41009"``,
a busy port is skipped) or ``None`` (any free port the kernel picks). docs/network.md
explains each setting.
"""

from __future__ import annotations

import os

NETWORK_SETTINGS = ("control_ports", "agent_ports", "tls", "tls_cert_file", "tls_key_file", "tls_ca_file")
_PORT_SETTINGS = ("control_ports", "agent_ports")
_FILE_SETTINGS = ("tls_cert_file", "tls_key_file", "tls_ca_file")


def port_range(value, setting: str) -> range | None:
    """The ports ``value`` allows, in the order they are tried; ``None``: any free port.

    ``value``: ``None``, a port number, ``"low-high"`` (both included), or ``(low, high)``.
    Errors name ``setting`` (e.g. ``DataContext.control_ports``)."""
    if value is None:
        return None
    low = high = None
    if isinstance(value, bool):
        pass
    elif isinstance(value, int):
        low = high = value
    elif isinstance(value, str):
        parts = value.strip().split("-")
        if len(parts) in (1, 2) and all(p.strip().isdigit() for p in parts):
            low, high = int(parts[0]), int(parts[-1])
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(p, int) and not isinstance(p, bool) for p in value):
        low, high = value
    if low is None or not 1 <= low <= high <= 65535:
        raise ValueError(f"{setting} must be None (any free port), a port such as 41000 or a range such as "
                         f"'41000-41009' (ports 1-65535, low <= high), got {value!r}")
    return range(low, high + 1)


def validate_network_setting(name: str, value) -> None:
    """Raise `ValueError` naming ``DataContext.<name>`` unless ``value`` fits the setting."""
    setting = f"DataContext.{name}"
    if name in _PORT_SETTINGS:
        port_range(value, setting)
    elif name == "tls" and not isinstance(value, bool):
        raise ValueError(f"{setting} must be True (encrypt the control plane and host agents) or False, "
                         f"got {value!r}")
    elif name in _FILE_SETTINGS and value is not None:
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            raise ValueError(f"{setting} must be the path of a PEM file or None, got {value!r}")


def check_tls_files(cert_file, key_file, ca_file) -> None:
    """The TLS files together: a certificate needs its key, and each named file must be readable.
    Checked when a run starts (the files live on the driver's host, not where the DAG is parsed)."""
    if (cert_file is None) != (key_file is None):
        given, missing = ("tls_cert_file", "tls_key_file") if key_file is None else ("tls_key_file", "tls_cert_file")
        raise ValueError(f"DataContext.{given} is set but DataContext.{missing} is not: the driver's certificate "
                         "and its private key go together (or set neither: the driver then makes its own)")
    if ca_file is not None and cert_file is None:
        raise ValueError("DataContext.tls_ca_file is set without DataContext.tls_cert_file: the CA only says "
                         "which authority signed the driver's own certificate")
    for name, path in (("tls_cert_file", cert_file), ("tls_key_file", key_file), ("tls_ca_file", ca_file)):
        if path is not None and not os.access(str(path), os.R_OK):
            raise ValueError(f"DataContext.{name} {str(path)!r} is not a readable file on the driver's host")
