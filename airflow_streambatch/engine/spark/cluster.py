"""What a Spark cluster offers: the resources of the executors an application has, and of the
standalone workers it could get executors on.

PySpark exposes neither: ``SparkContext.resources`` is the driver's, and the status
tracker's executor infos carry no resources. The JVM has both. The executors' come from
the status store, the data behind the UI's (public) ``/executors`` REST endpoint. Under
dynamic allocation the executors that own GPUs exist only while GPU tasks wait for them,
so the cluster's GPUs are read where Spark's standalone master keeps them: its state, as
its web UI shows it. Reads are best effort: what cannot be read is ``None``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from pyspark import SparkContext

log = logging.getLogger(__name__)

SETTLE_S = 1.0  # executors registered while the count stayed the same this long: all that start now
_settled: dict[str, tuple[float, list[dict[str, int]]]] = {}  # application id -> (when, executors' resources)
_settled_lock = threading.Lock()
SETTLED_FOR_S = 10.0  # how long a settled count is reused (the start-time check and the slot count read it once)


@dataclass(frozen=True)
class Worker:
    """A standalone worker: its cores and its resources (name -> number of addresses)."""

    cores: int
    resources: dict[str, int] = field(default_factory=dict)


def _scala_map(m) -> dict:
    out = {}
    it = m.iterator()
    while it.hasNext():
        pair = it.next()
        out[pair._1()] = pair._2()
    return out


def executor_resources(sc: SparkContext) -> list[dict[str, int]]:
    """The resources (name -> number of addresses) of each live executor, the driver left out."""
    summaries = sc._jsc.sc().statusStore().executorList(True)
    found = []
    for i in range(summaries.size()):
        summary = summaries.apply(i)
        if summary.id() != "driver":
            found.append({name: len(info.addresses()) for name, info in _scala_map(summary.resources()).items()})
    return found


def registered_executors(sc: SparkContext, timeout_s: float) -> list[dict[str, int]]:
    """`executor_resources` once executors stopped registering (at most ``timeout_s``).

    An application's static executors register in the seconds after its context starts;
    counting them at once would count none.
    """
    with _settled_lock:
        cached = _settled.get(sc.applicationId)
        if cached is not None and time.monotonic() - cached[0] < SETTLED_FOR_S:
            return cached[1]
    deadline = time.monotonic() + timeout_s
    executors = executor_resources(sc)
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = executor_resources(sc)
        if len(now) != len(executors):
            executors, stable_since = now, time.monotonic()
        elif executors and time.monotonic() - stable_since >= SETTLE_S:
            break
    with _settled_lock:
        _settled[sc.applicationId] = (time.monotonic(), executors)
    return executors


def standalone_workers(sc: SparkContext) -> list[Worker] | None:
    """The alive workers of a standalone master (``spark://``), as its master state reports them;
    ``None`` on other cluster managers, or when the master cannot be asked."""
    if not sc.master.startswith("spark://"):
        return None
    jvm, jsc = sc._jvm, sc._jsc.sc()
    for master in sc.master[len("spark://"):].split(","):  # several with ZooKeeper HA: one is the leader
        host, _, port = master.rpartition(":")
        try:
            ref = jsc.env().rpcEnv().setupEndpointRef(jvm.org.apache.spark.rpc.RpcAddress(host, int(port)), "Master")
            request = getattr(getattr(jvm, "org.apache.spark.deploy.DeployMessages$RequestMasterState$"), "MODULE$")
            state_class = jvm.java.lang.Class.forName("org.apache.spark.deploy.DeployMessages$MasterStateResponse")
            state = ref.askSync(request, jvm.scala.reflect.ClassTag.apply(state_class))
            if str(state.status()) != "ALIVE":
                continue
            return [Worker(w.cores(), {name: len(info.addresses()) for name, info in
                                       _scala_map(w.resourcesInfo()).items()})
                    for w in state.workers() if w.isAlive()]
        except Exception as exc:  # noqa: BLE001 - best effort: the caller says what it could not learn
            log.debug("could not read the state of standalone master %s: %s", master, exc)
    return None
