"""The hook's Spark Connect path: an ``sc://`` connection, or a Connect session already running.

A connection of the Spark provider's ``spark_connect`` type is read by its own hook
(`SparkConnectHook.get_connection_url`: host, port, user id, token, ``use_ssl``); a
``spark`` or ``streambatch`` connection whose host is ``sc://host:port`` is its URL as
given. The URL can carry a token, so it is never logged: the log names the server's
address only. A Connect client can set only runtime properties of its session; asking
for a static one (``spark.executor.memory``) fails naming it, as on a running classic
session (`apply_to_active_session`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from urllib.parse import urlparse

from airflow_streambatch.engine.spark.connect import active_connect_session
from airflow_streambatch.engine.spark.session import apply_to_active_session

SPARK_CONNECT_CONN_TYPE = "spark_connect"  # apache-airflow-providers-apache-spark's connection type


def connect_url(conn_id: str, conn_type: str, master: str | None) -> str | None:
    """The Spark Connect URL of a connection; ``None`` when it names a classic master."""
    if conn_type == SPARK_CONNECT_CONN_TYPE:
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        return SparkConnectHook(conn_id).get_connection_url()
    return master if master and master.startswith("sc://") else None


def server_address(url: str) -> str:
    """``host:port`` of a Connect URL, for logs: without its parameters (a token)."""
    return urlparse(url.replace("sc://", "http://", 1)).netloc.rsplit("@", 1)[-1]


def connect_session(url: str | None, requested: Mapping[str, str], setting_name: Callable[[str], str],
                    log: logging.Logger):
    """The Connect session of this task: the one running in the process, else one to ``url``
    (``None`` and no session running: not a Connect task, returns ``None``)."""
    session = active_connect_session()
    if session is None and url is None:
        return None
    if session is None:
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        log.info("Connecting to the Spark Connect server at %s", server_address(url))
        session = ConnectSession.builder.remote(url).getOrCreate()
    else:
        log.info("Using the Spark Connect session already running in this process (session %s)", session.session_id)
    apply_to_active_session(session, requested, setting_name)
    return session
