"""Spark resource profiles for operators that ask for GPUs or custom resources (stage-level scheduling).

Only Spark knows which executor has which GPU, so on a cluster an operator with
``num_gpus`` or ``resources`` runs its jobs under a `ResourceProfile`: Spark then places
its tasks on executors that have the resource and assigns each task its addresses
(``TaskContext.resources()``). CPU operators run in the default profile and hold no GPU.
One profile per distinct request and SparkContext: each new profile is a new kind of
executor to Spark. How a profile is built depends on the cluster (measured on Spark 4.2
standalone, `docs/cluster-gpus.md`):

* ``executor``: dynamic allocation on. The profile asks for executors of its own (cores
  and the resource); Spark starts them only on workers that have the resource, and the
  default profile's executors, on every worker, need none. The way to run on a cluster
  where only some workers have GPUs.
* ``task``: dynamic allocation off. Spark allows only task requests (a
  `TaskResourceProfile`), served by the default profile's executors, so every executor
  must own the resource (``spark.executor.resource.gpu.amount``): workers without it get
  no executors at all.
* ``local``: ``local[...]`` masters support no stage-level scheduling; the driver's
  `ResourcePool` assigns GPU ids as before.

`check_stage_scheduling` refuses, at start and naming the setting, a pipeline the cluster
cannot place.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pyspark import SparkContext
from pyspark.resource import ExecutorResourceRequests, ResourceProfile, ResourceProfileBuilder, TaskResourceRequests
from pyspark.sql import SparkSession

from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.spark.cluster import executor_resources, registered_executors, standalone_workers

# A local property of every job on a cluster: the Spark resources its tasks asked for ("none": a CPU
# operator). `worker/task_runner._task_gpus` reads it (by this literal: the worker layer imports no spark/).
SPARK_RESOURCES_PROPERTY = "streambatch.sparkResources"
# The same mark for a Spark Connect job, which has no local properties: an environment variable its
# partition function sets in the Python worker while its tasks run (`connect_backend`).
SPARK_RESOURCES_ENV = "STREAMBATCH_SPARK_RESOURCES"
DOCS = "docs/cluster-gpus.md"

_profiles: dict[tuple, ResourceProfile] = {}
_profiles_lock = threading.Lock()


class ClusterResourcesError(StreamBatchError, ValueError):
    """The cluster, as configured, cannot place a pipeline's tasks; the message names the setting."""


def spark_resources(request: Mapping[str, float]) -> dict[str, float]:
    """Spark's names and per-task amounts of an engine request: ``GPU`` is Spark's ``gpu``; CPU is not a
    resource to Spark (every task takes ``spark.task.cpus`` cores)."""
    return {("gpu" if name == "GPU" else name): float(amount) for name, amount in request.items()
            if name != "CPU" and amount}


def engine_name(spark_name: str) -> str:
    return "GPU" if spark_name == "gpu" else spark_name


def is_local(sc: SparkContext) -> bool:
    return sc.master.startswith("local")


def _conf(sc: SparkContext, key: str, default: str | None = None) -> str | None:
    return sc.getConf().get(key, default)


def _dynamic(conf_get) -> bool:
    return (conf_get("spark.dynamicAllocation.enabled") or "").strip().lower() == "true"


def dynamic_allocation(sc: SparkContext) -> bool:
    return _dynamic(lambda key: _conf(sc, key))


def settings_mode(conf_get) -> str:
    """``local``, ``executor`` (dynamic allocation: profiles with executors of their own) or ``task``,
    from an application's settings (``conf_get``: a setting by key, ``None`` when unset), a classic
    context's or a Spark Connect session's."""
    if (conf_get("spark.master") or "local").startswith("local"):
        return "local"
    return "executor" if _dynamic(conf_get) else "task"


def profile_mode(sc: SparkContext) -> str:
    return settings_mode(lambda key: _conf(sc, key))


def spark_assigns_gpus(spark: SparkSession) -> bool:
    """Whether Spark assigns tasks their GPUs (clusters); else the driver's pool does (local mode)."""
    return not is_local(spark.sparkContext)


def task_cpus(sc: SparkContext) -> int:
    return max(1, int(_conf(sc, "spark.task.cpus", "1")))


def executor_shape(wanted: Mapping[str, float], cpus_per_task: int = 1,
                   executor_cores: int | None = None) -> tuple[int, dict[str, int]]:
    """Cores and resource amounts of one executor of an ``executor`` profile for ``wanted`` (Spark
    resource -> per-task amount). It runs one task at once for whole units (it owns exactly what
    one task uses), ``1/share`` tasks for shares of one unit (they share it), at most
    ``executor_cores`` (``spark.executor.cores``) allows."""
    per = min((int(1 / amount + 1e-9) if amount < 1 else 1 for amount in wanted.values()), default=1)
    if executor_cores:
        per = max(1, min(per, executor_cores // cpus_per_task))
    return cpus_per_task * per, {name: max(1, math.ceil(amount * per - 1e-9)) for name, amount in wanted.items()}


def executor_amounts(sc: SparkContext, wanted: Mapping[str, float]) -> tuple[int, dict[str, int]]:
    """`executor_shape` under this application's ``spark.task.cpus`` and ``spark.executor.cores``."""
    cores = _conf(sc, "spark.executor.cores")
    return executor_shape(wanted, task_cpus(sc), int(cores) if cores else None)


@dataclass(frozen=True)
class ProfileRequests:
    """What one operator's profile asks Spark for: per task (``cpus`` and resources), and, in
    ``executor`` mode, per executor (``executor_cores`` and resources; ``None`` in ``task`` mode).
    The one place both sessions compute it: `_build` makes a classic profile of it,
    `connect_profiles` a Spark Connect one."""

    cpus: int
    task: dict[str, float]
    executor_cores: int | None = None
    executor: dict[str, int] | None = None


def profile_requests(mode: str, wanted: Mapping[str, float], cpus_per_task: int = 1,
                     executor_cores: int | None = None) -> ProfileRequests:
    """The requests of a ``mode`` profile for ``wanted`` (Spark resource -> per-task amount), under
    ``spark.task.cpus`` and ``spark.executor.cores``."""
    if mode != "executor":
        return ProfileRequests(cpus_per_task, dict(wanted))
    cores, amounts = executor_shape(wanted, cpus_per_task, executor_cores)
    return ProfileRequests(cpus_per_task, dict(wanted), cores, amounts)


def settings_requests(conf_get, mode: str, wanted: Mapping[str, float]) -> ProfileRequests:
    """`profile_requests` under an application's ``spark.task.cpus`` and ``spark.executor.cores``
    (``conf_get`` as for `settings_mode`)."""
    cores = conf_get("spark.executor.cores")
    return profile_requests(mode, wanted, max(1, int(conf_get("spark.task.cpus") or 1)),
                            int(cores) if cores else None)


def _build(sc: SparkContext, mode: str, wanted: dict[str, float]) -> ResourceProfile:
    asked = settings_requests(lambda key: _conf(sc, key), mode, wanted)
    tasks = TaskResourceRequests().cpus(asked.cpus)
    for name, amount in asked.task.items():
        tasks.resource(name, amount)
    builder = ResourceProfileBuilder().require(tasks)
    if asked.executor is not None:
        executors = ExecutorResourceRequests().cores(asked.executor_cores)
        for name, amount in asked.executor.items():
            executors.resource(name, amount)
        builder.require(executors)
    return builder.build


def profile_for(sc: SparkContext, request: Mapping[str, float]) -> ResourceProfile | None:
    """The resource profile an operator's jobs run under; ``None``: the default profile (CPU
    operators, and every operator in local mode). Cached per SparkContext and request."""
    wanted = spark_resources(request)
    mode = profile_mode(sc)
    if not wanted or mode == "local":
        return None
    key = (sc.applicationId, mode, tuple(sorted(wanted.items())))
    with _profiles_lock:
        if key not in _profiles:
            _profiles[key] = _build(sc, mode, wanted)
        return _profiles[key]


def job_property(sc: SparkContext, request: Mapping[str, float]) -> str | None:
    """The value of `SPARK_RESOURCES_PROPERTY` for a job of ``request``; ``None`` in local mode."""
    if is_local(sc):
        return None
    return ",".join(sorted(spark_resources(request))) or "none"


def _wait_s(sc: SparkContext) -> float:
    return float(sc._jsc.sc().conf().getTimeAsSeconds("spark.scheduler.maxRegisteredResourcesWaitingTime", "30s"))


def per_executor_setting(name: str) -> str:
    return f"spark.executor.resource.{name}.amount"


def worker_settings(name: str) -> str:
    return f"spark.worker.resource.{name}.amount and spark.worker.resource.{name}.discoveryScript"


def check_stage_scheduling(spark: SparkSession, requests: Mapping[str, Mapping[str, float]]) -> None:
    """Fail at start, naming the setting, when the cluster cannot place the tasks of ``requests``
    (operator name -> its request); local mode always can (the driver assigns GPU ids)."""
    sc = spark.sparkContext
    mode = profile_mode(sc)
    if mode == "local":
        return
    needs = check_requests((key for key, _ in sc.getConf().getAll()), requests)
    if not needs:
        return
    if mode == "task":
        _check_static_executors(sc, needs)
    else:
        _check_workers(sc, needs)


def check_requests(conf_keys: Iterable[str],
                   requests: Mapping[str, Mapping[str, float]]) -> dict[str, tuple[str, float]]:
    """What both kinds of session refuse from the application's settings (``conf_keys``) and the
    operators' ``requests`` alone: a resource every task would hold, a share Spark cannot give.
    Returns each Spark resource asked for -> (an operator that asks for it, its amount)."""
    globally = sorted(m.group(1) for key in conf_keys
                      if (m := re.fullmatch(r"spark\.task\.resource\.([^.]+)\.amount", key)))
    if globally:
        raise ClusterResourcesError(
            f"spark.task.resource.{globally[0]}.amount is set, so every task of every operator would hold "
            f"{globally[0]}, CPU operators included; unset it and give num_gpus (or resources=) to the operators "
            f"that use {globally[0]}: the engine asks Spark for them per operator ({DOCS})")
    needs: dict[str, tuple[str, float]] = {}
    for operator, request in requests.items():
        for name, amount in spark_resources(request).items():
            if amount > 0.5 and amount != int(amount):
                label = "num_gpus" if name == "gpu" else f"resources[{engine_name(name)!r}]"
                raise ClusterResourcesError(
                    f"{operator} asks for {label}={amount:g}; Spark gives a task either whole units or a share of "
                    f"one of at most 0.5 (1/n): use {label}=0.5 or {math.ceil(amount)}")
            if name not in needs or amount > needs[name][1]:
                needs[name] = (operator, amount)  # the largest ask names what the cluster must offer
    return needs


def check_static_executor_settings(conf_get, needs: Mapping[str, tuple[str, float]]) -> None:
    """With dynamic allocation off, tasks that ask for a resource run only on executors of the default
    profile that own enough of it (``spark.executor.resource.<name>.amount``; ``conf_get``: the
    application's setting by key, ``None`` when unset)."""
    for name, (operator, amount) in needs.items():
        owned = conf_get(per_executor_setting(name))
        if owned is None:
            raise ClusterResourcesError(
                f"{operator} asks for {name}, but this application's executors own none, and with dynamic "
                f"allocation off Spark runs such a task only on an executor of the default profile that owns "
                f"{name}. Where only some workers have {name}: set spark.dynamicAllocation.enabled=true (with "
                f"spark.dynamicAllocation.shuffleTracking.enabled=true, Spark 4's default; Spark then starts "
                f"executors with {name} for these operators only); where every executor should own it: set "
                f"{per_executor_setting(name)} (workers without {name} then get no executors) ({DOCS})")
        if float(owned) < amount:
            raise ClusterResourcesError(
                f"{operator} asks for {amount:g} {name} per task, but each executor owns {owned} "
                f"({per_executor_setting(name)}): raise it, or ask for less ({DOCS})")


def _check_static_executors(sc: SparkContext, needs: dict[str, tuple[str, float]]) -> None:
    check_static_executor_settings(lambda key: _conf(sc, key), needs)
    executors = registered_executors(sc, _wait_s(sc))
    for name, (operator, _) in needs.items():
        if not any(ex.get(name) for ex in executors):
            raise ClusterResourcesError(
                f"{operator} asks for {name}, but none of the {len(executors)} executor(s) that registered owns "
                f"{name} ({per_executor_setting(name)}={_conf(sc, per_executor_setting(name))}): set "
                f"{worker_settings(name)} on the workers that have it ({DOCS})")


def _check_workers(sc: SparkContext, needs: dict[str, tuple[str, float]]) -> None:
    workers = standalone_workers(sc)
    if workers is None:
        return  # not standalone: only the cluster manager knows, and it starts the executors when asked
    for name, (operator, amount) in needs.items():
        cores, amounts = executor_amounts(sc, {name: amount})
        if not any(w.resources.get(name, 0) >= amounts[name] and w.cores >= cores for w in workers):
            have = sorted(w.resources.get(name, 0) for w in workers)
            raise ClusterResourcesError(
                f"{operator} asks for {name}, but no worker of {sc.master} offers an executor with {amounts[name]} "
                f"{name} and {cores} core(s) (the workers' {name}: {have}): set {worker_settings(name)} on the "
                f"workers that have it ({DOCS})")


def offered(sc: SparkContext, names: Iterable[str]) -> dict[str, float] | None:
    """Units of each Spark resource in ``names`` that tasks can be placed on: on the executors of a
    static application; under dynamic allocation on the standalone workers (elsewhere on the executors
    that run now); ``None`` in local mode, where Spark places nothing by resource."""
    names = set(names)
    mode = profile_mode(sc)
    if mode == "local" or not names:
        return None if mode == "local" else {}
    if mode == "task":
        found = registered_executors(sc, _wait_s(sc))
        return {name: float(sum(ex.get(name, 0) for ex in found)) for name in names}
    workers = standalone_workers(sc)
    if workers is None:  # another cluster manager: the executors with the resource that run now, if any
        found = executor_resources(sc)
        return {name: float(sum(ex.get(name, 0) for ex in found)) for name in names}
    return {name: float(sum(w.resources.get(name, 0) for w in workers)) for name in names}
