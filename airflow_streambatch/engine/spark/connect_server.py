"""Starting a Spark Connect server on this machine, as Spark's ``start-connect-server.sh`` does.

pip's pyspark has no ``sbin/`` scripts, but it has ``spark-submit`` and the Connect server's
jar: the server is ``spark-submit --class ...SparkConnectServer spark-internal``. The tests
and benchmarks start one this way (a process of its own, as a user's server is); a user's
deployment starts its own (docs/spark-connect.md, ``docker-compose.yaml``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import IO

from airflow_streambatch.engine.spark.session import with_spark_defaults

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def start_connect_server(master: str, port: int, log: IO, conf: Mapping[str, str] | None = None,
                         env: Mapping[str, str] | None = None, timeout_s: float = 120.0) -> subprocess.Popen:
    """A Connect server for ``master`` listening on 127.0.0.1:``port`` (with `SPARK_DEFAULTS` and ``conf``),
    once it accepts connections; its output goes to ``log``. `TimeoutError` if it exits or is not
    listening within ``timeout_s`` (the log says why)."""
    settings = with_spark_defaults({"spark.connect.grpc.binding.address": "127.0.0.1",
                                    "spark.connect.grpc.binding.port": str(port), **(conf or {})})
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    server = subprocess.Popen([spark_submit, "--master", master, "--class", SERVER_CLASS,
                               *(arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")),
                               "spark-internal"], stdout=log, stderr=subprocess.STDOUT, env=dict(env or os.environ))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise TimeoutError(f"the Spark Connect server did not listen on port {port} within {timeout_s:.0f} s "
                                   f"(see {getattr(log, 'name', 'its log')})") from None
            time.sleep(0.2)


def stop_connect_server(server: subprocess.Popen, timeout_s: float = 60.0) -> None:
    """Stop it (SIGTERM: Spark's shutdown hooks run), killing it after ``timeout_s``."""
    server.terminate()
    try:
        server.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
