"""A Spark Connect session (``sc://``) as the engine's runtime: what it offers and what it needs.

A Connect client has no JVM and no ``SparkContext``: the engine learns the master and the
task slots from the session's configuration and from one small job, and ships code as
session artifacts. Its own part stays in this process: the scheduler loop and the control
plane, which the tasks call back on. So executors must reach this process, as a
client-mode driver's executors reach the driver; `check_connect_session` runs one task per
slot that connects to the control plane and, on a ``local`` master, reads a file this
process wrote (blocks are files on the host: the server must share this host's disk).
Both fail at start, naming what to change.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
import uuid
from collections.abc import Iterable, Mapping

from pyspark.sql import SparkSession

from airflow_streambatch.engine.errors import StreamBatchError

CONNECT_DOCS = "docs/spark-connect.md"
PROBE_TIMEOUT_S = 10.0  # a task's connection to the control plane; a firewall drops packets rather than refusing


class ConnectSessionError(StreamBatchError, RuntimeError):
    """A Spark Connect session the engine cannot run on as configured; the message names the setting."""


def is_connect(spark) -> bool:
    """Whether ``spark`` is a Spark Connect client session (no JVM, no ``sparkContext``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def active_connect_session() -> SparkSession | None:
    """The Connect session this thread (else this process) uses, if one was created: a user who built
    ``SparkSession.builder.remote(...)`` gets the engine on it."""
    try:
        from pyspark.sql.connect.session import SparkSession as ConnectSession
    except ImportError:  # pragma: no cover - grpcio comes with pyspark-client, a dependency
        return None
    session = ConnectSession.getActiveSession() or ConnectSession._get_default_session()
    return session if session is not None and not getattr(session, "is_stopped", False) else None


_worker_env: dict[str, dict[str, str]] = {}  # Connect session id -> what its engine tasks add to their environment


def worker_environment(spark) -> dict[str, str]:
    """Variables this Connect session's engine tasks set in their Python worker while they run (the hook puts
    an object-store connection's credentials here): what a classic ``SparkContext.environment`` gives its
    workers, which a client cannot set on the server. `connect_backend` restores the worker's own after."""
    return _worker_env.setdefault(spark.session_id, {})


def connect_master(spark) -> str:
    """The server's master URL (``spark.master`` is in every session's configuration)."""
    return spark.conf.get("spark.master", "local[*]") or "local[*]"


def local_master_cores(master: str) -> int | None:
    """Task threads of a ``local``, ``local[N]``, ``local[*]`` or ``local[N,F]`` master; ``None`` for a cluster."""
    local = re.match(r"local(?:\[(\d+|\*)(?:,\d+)?\])?$", master)
    if local is None:
        return None
    return 1 if local.group(1) is None else (os.cpu_count() or 1) if local.group(1) == "*" else int(local.group(1))


def connect_task_slots(spark) -> int:
    """Spark tasks that run at once on the server: ``local[N]`` threads, else its executors' cores
    (the partitions Spark gives a range without a count: ``defaultParallelism``), over ``spark.task.cpus``."""
    cores = local_master_cores(connect_master(spark))
    if cores is None:  # collected, not counted: a count's exchange would be a shuffle between executors
        cores = len(spark.range(0, 1 << 16).mapInArrow(_a_row_per_partition, "one int").collect())
    return max(1, cores // max(1, int(spark.conf.get("spark.task.cpus", "1") or 1)))


def _a_row_per_partition(batches):
    import pyarrow as pa

    for _ in batches:
        pass
    yield pa.record_batch([pa.array([1], pa.int32())], names=["one"])


def _asked(requests: Iterable[Mapping[str, float]]) -> set[str]:
    return {name for request in requests for name, amount in request.items() if name != "CPU" and amount}


def connect_slots(spark, requests: Iterable[Mapping[str, float]], task_slots: int) -> dict[str, float]:
    """Execution slots of a Connect session: its task slots as CPU; a ``local`` master's GPUs, counted
    on this host (the server shares it: `check_connect_session`); a cluster's GPUs and custom resources
    as its settings give them (`connect_profiles.resource_slots`)."""
    from airflow_streambatch.engine.spark.connect_profiles import resource_slots
    from airflow_streambatch.engine.spark.local_gpus import check_slots, detect_local_gpus

    requests = list(requests)
    slots: dict[str, float] = {"CPU": float(task_slots)}
    master = connect_master(spark)
    if local_master_cores(master) is None:
        slots.update(resource_slots(spark, requests, task_slots))
    elif "GPU" in _asked(requests):
        slots["GPU"] = float(detect_local_gpus())
    check_slots(master, requests, slots)
    return slots


def client_address() -> str:
    """The address tasks call this process back at, chosen as Spark chooses a classic driver's
    (``spark.driver.host``): ``SPARK_LOCAL_HOSTNAME``, else the name of ``SPARK_LOCAL_IP``, else
    this host's name. So a process that runs both kinds of session keeps one control plane."""
    if os.environ.get("SPARK_LOCAL_HOSTNAME"):
        return os.environ["SPARK_LOCAL_HOSTNAME"]
    ip = os.environ.get("SPARK_LOCAL_IP")
    if not ip:
        return socket.getfqdn()
    try:
        return socket.gethostbyaddr(ip)[0]
    except OSError:
        return ip


def _probe(host: str, port: int, marker: str | None, token: str, timeout_s: float):
    """The function of the start-up check's job: each task connects to the control plane and reads the marker."""

    def probe(batches):
        import pyarrow as pa

        for batch in batches:
            for _ in range(batch.num_rows):
                problem = ""
                try:
                    socket.create_connection((host, port), timeout=timeout_s).close()
                except OSError as exc:
                    problem = f"cannot connect to {host}:{port}: {exc}"
                if not problem and marker is not None:
                    try:
                        with open(marker) as f:
                            seen = f.read()
                    except OSError:
                        seen = ""
                    if seen != token:
                        problem = f"cannot read {marker}"
                yield pa.record_batch([pa.array([socket.gethostname()]), pa.array([problem])],
                                      names=["host", "problem"])

    return probe


def check_connect_session(spark, host: str, port: int, task_slots: int) -> None:
    """Fail now, by setting, where tasks could not call back this process's control plane at
    ``host:port``, or (a ``local`` master) where the server does not share this host's files."""
    master = connect_master(spark)
    local = master.startswith("local")
    with tempfile.TemporaryDirectory(prefix="streambatch-connect-") as folder:
        marker, token = None, uuid.uuid4().hex
        if local:
            marker = os.path.join(folder, "marker")
            with open(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(token)
        rows = (spark.range(0, task_slots, 1, task_slots)
                .mapInArrow(_probe(host, port, marker, token, PROBE_TIMEOUT_S), "host string, problem string")
                .collect())
    problems = sorted({f"{r.host}: {r.problem}" for r in rows if r.problem})
    if not problems:
        return
    if local and any("cannot read" in p for p in problems):
        raise ConnectSessionError(
            f"the Spark Connect server runs a local master ({master}) on another host than this client "
            f"({'; '.join(problems)}). Blocks are files on the host that wrote them, so a local-master server "
            f"must run on this host; for a remote server, give it a cluster master. See {CONNECT_DOCS}")
    raise ConnectSessionError(
        f"Spark's tasks cannot reach this client's control plane at {host}:{port} ({'; '.join(problems)}). "
        "Executors call the engine back as they would a client-mode driver: set SPARK_LOCAL_IP to an address of "
        f"this host that they can reach, and DataContext.control_ports to ports the network lets through. See "
        f"{CONNECT_DOCS}")
