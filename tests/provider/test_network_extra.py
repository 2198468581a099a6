"""The Spark connection's ``network`` extra (`hooks/network_extra.py`): ports and TLS files a platform
team fixes once for every DAG, checked like ``data_context``, with errors naming the connection."""

from __future__ import annotations

import json

import pytest


def _conn(monkeypatch, extra) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SB_NET", json.dumps({"conn_type": "spark", "host": "spark://m:7077",
                                                           "extra": extra}))


def test_the_network_extra_gives_the_engine_its_ports_and_certificate_paths(monkeypatch):
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    _conn(monkeypatch, {"network": {"control_ports": "41000-41009", "agent_ports": 42000, "tls": "True",
                                    "tls_cert_file": "/etc/sb/tls.crt", "tls_key_file": "/etc/sb/tls.key"}})
    assert StreamBatchHook("sb_net").network_settings == {
        "control_ports": "41000-41009", "agent_ports": 42000, "tls": True,
        "tls_cert_file": "/etc/sb/tls.crt", "tls_key_file": "/etc/sb/tls.key"}
    _conn(monkeypatch, {"conf": {}})
    assert StreamBatchHook("sb_net").network_settings == {}
    assert StreamBatchHook(None).network_settings == {}  # embedded Spark: no connection


@pytest.mark.parametrize(("network", "error"), [
    ({"memory_limit": 1}, r"the network extra of connection 'sb_net' has unknown key\(s\) 'memory_limit': it takes "
                          r"control_ports, agent_ports, tls"),
    ({"control_ports": "42000-41000"}, r"the network extra of connection 'sb_net'\['control_ports'\] must be None"),
    ("41000", r"the network extra of connection 'sb_net' must be a dict"),
])
def test_a_wrong_network_extra_names_the_connection_and_the_key(monkeypatch, network, error):
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    _conn(monkeypatch, {"network": network})
    with pytest.raises(ValueError, match=error):
        _ = StreamBatchHook("sb_net").network_settings
