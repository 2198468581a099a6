"""GPUs and custom resources on a Spark Connect session to a cluster: stage-level scheduling through Connect.

Spark 4 lets a Connect client create a resource profile on the server and run a
``mapInArrow`` under it (SPARK-46812), so an operator's launches get the same profile a
classic job gets with ``rdd.withResources`` (`profiles.profile_requests` computes both):
Spark places its tasks where the resource is and gives each its addresses
(``TaskContext.resources()``). Connect has no local properties, so the mark that tells a
task it asked Spark for its GPUs travels as an environment variable the launch's function
sets in the Python worker (`profiles.SPARK_RESOURCES_ENV`).

A client has no JVM: it reads the application's settings (``spark.conf``), never its
executors or the standalone master's workers. So at start, besides the checks both
sessions make from settings (`profiles.check_requests`, and with dynamic allocation off
`profiles.check_static_executor_settings`), each profile runs one probe task, which must be
placed, and given the resource, within ``spark.scheduler.maxRegisteredResourcesWaitingTime``;
else the run is refused naming the workers' settings. Slots for a resource are estimated
from settings (`resource_slots`); ``DataContext.resources`` overrides them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from airflow_streambatch.engine.spark.profiles import (
    DOCS,
    ClusterResourcesError,
    ProfileRequests,
    check_requests,
    check_static_executor_settings,
    engine_name,
    executor_shape,
    per_executor_setting,
    settings_mode,
    settings_requests,
    spark_resources,
    worker_settings,
)

_profiles: dict[tuple, object] = {}  # (Connect session, mode, request) -> its profile, created on the server once
_placed: set[tuple] = set()  # the keys of `_profiles` whose probe task Spark placed: not probed again
_profiles_lock = threading.Lock()


def _setting(spark, key: str, default: str | None = None) -> str | None:
    return spark.conf.get(key, default)


def connect_mode(spark) -> str:
    """`profiles.settings_mode` of a Connect session's application."""
    return settings_mode(lambda key: _setting(spark, key))


@contextmanager
def _active(spark) -> Iterator[None]:
    """Make ``spark`` this thread's active Connect session meanwhile: pyspark creates a Connect profile on
    the active session, which it sets only in the thread that built the session (the engine may have
    found it as the process's default)."""
    from pyspark.sql.connect.session import SparkSession

    local = SparkSession._active_session
    before = getattr(local, "session", None)
    local.session = spark
    try:
        yield
    finally:
        local.session = before


def _create(spark, asked: ProfileRequests):
    from pyspark.resource import ExecutorResourceRequest, TaskResourceRequest
    from pyspark.sql.connect.resource.profile import ResourceProfile

    tasks = {"cpus": TaskResourceRequest("cpus", asked.cpus)}
    tasks.update({name: TaskResourceRequest(name, amount) for name, amount in asked.task.items()})
    executors = {}
    if asked.executor is not None:
        executors["cores"] = ExecutorResourceRequest("cores", asked.executor_cores)
        executors.update({name: ExecutorResourceRequest(name, amount) for name, amount in asked.executor.items()})
    with _active(spark):
        return ResourceProfile(executors, tasks)


class ConnectProfiles:
    """The resource profiles a Connect session's launches run under, and the mark their tasks get."""

    def __init__(self, spark):
        self.spark = spark
        self.mode = connect_mode(spark)

    def key(self, request: Mapping[str, float]) -> tuple:
        return self.spark.session_id, self.mode, tuple(sorted(spark_resources(request).items()))

    def profile(self, request: Mapping[str, float]):
        """The Connect ``ResourceProfile`` of an operator's launches; ``None``: the default profile
        (CPU operators, and every operator on a ``local`` master, whose GPUs the driver numbers)."""
        wanted = spark_resources(request)
        if not wanted or self.mode == "local":
            return None
        key = self.key(request)
        with _profiles_lock:
            if key not in _profiles:
                try:
                    _profiles[key] = _create(self.spark, settings_requests(
                        lambda key: _setting(self.spark, key), self.mode, wanted))
                except Exception as exc:  # the server refused it: its reason names the setting
                    raise ClusterResourcesError(
                        f"the Spark Connect server refused a resource profile for {sorted(wanted)}: {exc} "
                        f"({DOCS})") from exc
            return _profiles[key]

    def marker(self, request: Mapping[str, float]) -> str | None:
        """What the tasks of ``request`` asked Spark for (`profiles.SPARK_RESOURCES_ENV`); ``None`` on a
        ``local`` master."""
        if self.mode == "local":
            return None
        return ",".join(sorted(spark_resources(request))) or "none"


def _holds(names: list[str]):
    """The probe's function: the names of the resources Spark gave its task, of those in ``names``."""

    def probe(batches):
        import pyarrow as pa
        from pyspark import TaskContext

        for batch in batches:
            for _ in range(batch.num_rows):
                given = TaskContext.get().resources()
                held = [name for name in names if name in given and given[name].addresses]
                yield pa.record_batch([pa.array([",".join(held)])], names=["held"])

    return probe


def _wait_s(spark) -> float:
    value = (_setting(spark, "spark.scheduler.maxRegisteredResourcesWaitingTime", "30s") or "30s").strip().lower()
    for suffix, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("min", 60.0), ("h", 3600.0)):
        if value.endswith(suffix) and value[:-len(suffix)].replace(".", "", 1).isdigit():
            return float(value[:-len(suffix)]) * scale
    return float(value) / 1000 if value.replace(".", "", 1).isdigit() else 30.0  # a bare number is ms to Spark


def _probe(spark, profile, names: list[str], wait_s: float) -> str | None:
    """Run one task under ``profile``; the resources it held, or ``None`` when Spark placed none in ``wait_s``."""
    tag = f"streambatch-profile-probe-{uuid.uuid4().hex[:12]}"
    outcome: dict = {}

    def run() -> None:
        spark.addTag(tag)  # Connect's tags belong to the thread that starts the operation
        try:
            outcome["rows"] = spark.range(0, 1, 1, 1).mapInArrow(_holds(names), "held string",
                                                                 profile=profile).collect()
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc
        finally:
            spark.removeTag(tag)

    thread = threading.Thread(target=run, name=tag, daemon=True)
    thread.start()
    thread.join(wait_s)
    if thread.is_alive():
        spark.interruptTag(tag)
        thread.join(10.0)
        return None
    if "error" in outcome:
        raise ClusterResourcesError(f"a probe task under the resource profile of {names} failed: "
                                    f"{outcome['error']} ({DOCS})") from outcome["error"]
    return outcome["rows"][0].held


def check_connect_stage_scheduling(spark, requests: Mapping[str, Mapping[str, float]]) -> ConnectProfiles:
    """The run's profiles, created on the server, once the cluster showed it can place each: fail at start,
    naming the setting, where it cannot (`profiles.check_requests`; a probe task per profile)."""
    profiles = ConnectProfiles(spark)
    if profiles.mode == "local":
        return profiles
    needs = check_requests(spark.conf.getAll.keys(), requests)
    if not needs:
        return profiles
    if profiles.mode == "task":
        check_static_executor_settings(lambda key: _setting(spark, key), needs)
    wait_s = _wait_s(spark)
    distinct = {tuple(sorted(spark_resources(r).items())): (op, r) for op, r in requests.items() if spark_resources(r)}
    for operator, request in distinct.values():
        if profiles.key(request) in _placed:
            continue
        names = sorted(spark_resources(request))
        held = _probe(spark, profiles.profile(request), names, wait_s)
        if held is None or sorted(filter(None, held.split(","))) != names:
            where = f"set {' and '.join(worker_settings(n) for n in names)} on the workers that have them"
            if profiles.mode == "executor":
                where += (", with cores free there for executors of this request (the default profile's executors "
                          "may hold them all: spark.executor.cores, spark.dynamicAllocation.maxExecutors)")
            else:
                where = (f"executors own {', '.join(names)} ({', '.join(per_executor_setting(n) for n in names)}) but "
                         f"none took the task: {where}")
            raise ClusterResourcesError(
                f"{operator} asks for {', '.join(names)}, and Spark placed no task of that request within "
                f"{wait_s:g} s (spark.scheduler.maxRegisteredResourcesWaitingTime) on "
                f"{_setting(spark, 'spark.master')}: {where} ({DOCS})")
        _placed.add(profiles.key(request))
    return profiles


def resource_slots(spark, requests: Iterable[Mapping[str, float]], task_slots: int) -> dict[str, float]:
    """Units of each resource ``requests`` ask for that a Connect session's cluster offers, estimated from
    settings (a client cannot count executors or workers). Dynamic allocation off: every executor owns
    ``spark.executor.resource.<name>.amount``, and there are ``task slots x spark.task.cpus /
    spark.executor.cores`` executors (one when ``spark.executor.cores`` is unset: standalone then gives an
    executor all of a worker's cores, and a client cannot count the workers). On: each profile may have
    ``spark.dynamicAllocation.maxExecutors`` executors (one executor's worth when unset)."""
    mode = connect_mode(spark)
    requests = list(requests)
    names = {name for request in requests for name in spark_resources(request)}
    if mode == "local" or not names:
        return {}
    cores = _setting(spark, "spark.executor.cores")
    cpus = max(1, int(_setting(spark, "spark.task.cpus", "1") or 1))
    slots: dict[str, float] = {}
    if mode == "task":
        executors = max(1, task_slots * cpus // int(cores)) if cores else 1
        for name in names:
            slots[engine_name(name)] = float(executors * float(_setting(spark, per_executor_setting(name), "0") or 0))
        return slots
    most = _setting(spark, "spark.dynamicAllocation.maxExecutors")
    executors = int(most) if most and int(most) < 1 << 20 else 1
    for request in requests:
        wanted = spark_resources(request)
        if not wanted:
            continue
        _, amounts = executor_shape(wanted, cpus, int(cores) if cores else None)
        for name, amount in amounts.items():
            slots[engine_name(name)] = max(slots.get(engine_name(name), 0.0), float(executors * amount))
    return slots
