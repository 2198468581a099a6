"""The Spark session the engine runs on: starting or joining it, shipping this package
to its executors, and reading how many execution slots it offers (CPU, and the GPUs and
custom resources of its executors or workers: `profiles.py`, `cluster.py`)."""

from __future__ import annotations

import importlib
import logging
import os
import re
import site
import sys
import sysconfig
import tempfile
import threading
import zipfile
from collections.abc import Iterable, Mapping

from pyspark.sql import SparkSession

from airflow_streambatch.engine.spark.cluster import standalone_workers
from airflow_streambatch.engine.spark.java import ensure_java
from airflow_streambatch.engine.spark.profiles import (
    dynamic_allocation,
    engine_name,
    is_local,
    offered,
    spark_resources,
)

# What every session the engine runs on should have; set in one place for get_spark, the hook's
# client-mode driver and spark-submit runs, the tests and the benchmarks. Settings a user gives
# (a connection's conf, spark_conf) win over these: merge them with `with_spark_defaults`.
SPARK_DEFAULTS: dict[str, str] = {
    # jobs run at once, each in a FAIR pool named after its operator (`backend.py`), so CPU and GPU work share executors
    "spark.scheduler.mode": "FAIR",
    # console progress bars interleave with the engine's own progress lines
    "spark.ui.showConsoleProgress": "false",
    # Spark's default, stated: a stateful UDF's instance lives in its Python worker across tasks (`worker/udf.py`)
    "spark.python.worker.reuse": "true",
}
SPARK_LOG_LEVEL = "WARN"  # `SparkContext.setLogLevel` of sessions the engine starts (tests and benchmarks: ERROR)


def with_spark_defaults(conf: dict[str, str] | None = None) -> dict[str, str]:
    """`SPARK_DEFAULTS` with ``conf`` on top: explicit settings win."""
    return {**SPARK_DEFAULTS, **(conf or {})}


_session_lock = threading.Lock()
# py4j logs every finished job thread's connection at INFO; that drowns the progress lines.
logging.getLogger("py4j").setLevel(logging.WARNING)


def get_spark(min_slots: int = 0) -> SparkSession:
    """The active SparkSession, or a local one with at least ``min_slots`` task slots."""
    with _session_lock:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        ensure_java()
        slots = max(os.cpu_count() or 1, int(min_slots))
        spark = (
            SparkSession.builder.master(f"local[{slots}]")
            .appName("airflow-streambatch")
            .config(map=SPARK_DEFAULTS)
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel(SPARK_LOG_LEVEL)
        return spark


_shipped: set[tuple[str, str]] = set()  # (application id, top-level module) already added


def _zip_package(package_dir: str) -> str:
    name = os.path.basename(package_dir.rstrip(os.sep))
    archive = os.path.join(tempfile.mkdtemp(prefix="streambatch-pyfiles-"), f"{name}.zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for folder, _, files in os.walk(package_dir):
            for file_name in files:
                if file_name.endswith(".py"):
                    path = os.path.join(folder, file_name)
                    zf.write(path, os.path.relpath(path, os.path.dirname(package_dir.rstrip(os.sep))))
    return archive


def _add_py_files(spark: SparkSession, module_name: str) -> None:
    """``addPyFile`` the top-level module or package of ``module_name`` (once per application)."""
    sc = spark.sparkContext
    top = module_name.split(".")[0]
    if (sc.applicationId, top) in _shipped:
        return
    path = getattr(importlib.import_module(top), "__file__", None)
    if path is None:
        return  # a namespace package: nothing to zip
    if os.path.basename(path) == "__init__.py":
        sc.addPyFile(_zip_package(os.path.dirname(path)))
    else:
        sc.addPyFile(path)
    _shipped.add((sc.applicationId, top))


def ship_package(spark: SparkSession) -> None:
    """Make this package importable on a cluster's executors (once per application).

    Tasks run ``airflow_streambatch.engine.tasks`` on the executors' Python workers,
    so a cluster whose workers do not have the package installed gets it as a zip
    through ``addPyFile``, the way ``spark-submit --py-files`` ships code. Local
    masters share the driver's interpreter and need nothing.
    """
    if not spark.sparkContext.master.startswith("local"):
        _add_py_files(spark, "airflow_streambatch")


def ship_user_module(spark: SparkSession, module_name: str) -> None:
    """Make a user's pipeline module importable by Spark's Python workers, local ones included.

    Airflow puts the DAG folder on the task's ``sys.path`` but not in ``PYTHONPATH``,
    so Python workers could not import a pipeline module that lives there, nor the
    UDF classes it defines (cloudpickle refers to them by module name). Modules
    installed in site-packages are left alone: workers import them like the driver.
    """
    top = module_name.split(".")[0]
    path = getattr(importlib.import_module(top), "__file__", None) or ""
    installed = any(path.startswith(p) for p in (*site.getsitepackages(), sysconfig.get_paths()["stdlib"]))
    if path and not installed and top != "airflow_streambatch":
        _add_py_files(spark, top)


def slots_from_spark(spark: SparkSession, requests: Iterable[Mapping[str, float]] = ()) -> dict[str, float]:
    """Execution slots Spark offers: task slots as CPU, and the units of each resource the
    ``requests`` (operators' requests) ask for that Spark can place tasks on.

    Resources are counted where the tasks will run (`profiles.offered`): the executors that
    own them (only some may: a heterogeneous cluster), or under dynamic allocation the
    standalone workers that have them, since executors with GPUs start only when GPU tasks
    wait. Local mode counts no resources (``DataContext.resources`` gives them).
    """
    sc = spark.sparkContext
    cores = _dynamic_cluster_cores(sc, default_profile=True)
    slots: dict[str, float] = {"CPU": float(cores if cores is not None else sc.defaultParallelism)}
    names = {name for request in requests for name in spark_resources(request)}
    for name, amount in (offered(sc, names) or {}).items():
        slots[engine_name(name)] = amount
    return slots


def _dynamic_cluster_cores(sc, default_profile: bool) -> int | None:
    """Cores the application may get under dynamic allocation on a standalone master: its alive
    workers' cores, at most ``spark.cores.max``; for the default profile's executors (those of
    CPU operators) also at most ``spark.dynamicAllocation.maxExecutors`` (a cap per profile) of
    ``spark.executor.cores``. ``None`` elsewhere: ``defaultParallelism`` counts the executors
    that registered, and under dynamic allocation executors start only when tasks wait."""
    if not dynamic_allocation(sc) or is_local(sc):
        return None
    workers = standalone_workers(sc)
    if not workers:
        return None
    conf = sc.getConf()
    cores = sum(w.cores for w in workers)
    if conf.get("spark.cores.max"):
        cores = min(cores, int(conf.get("spark.cores.max")))
    max_executors, per_executor = conf.get("spark.dynamicAllocation.maxExecutors"), conf.get("spark.executor.cores")
    if default_profile and max_executors and per_executor:
        cores = min(cores, int(max_executors) * int(per_executor))
    return max(1, cores)


def spark_task_slots(spark: SparkSession) -> int:
    """Spark tasks that run at once: ``local[N]`` threads, else the executors' cores
    (Spark's default parallelism; under dynamic allocation the cores it may get, in every
    profile), divided by ``spark.task.cpus``."""
    sc = spark.sparkContext
    local = re.match(r"local(?:\[(\d+|\*)(?:,\d+)?\])?$", sc.master)
    if local:
        cores = 1 if local.group(1) is None else (os.cpu_count() or 1) if local.group(1) == "*" else int(local.group(1))
    else:
        dynamic = _dynamic_cluster_cores(sc, default_profile=False)
        cores = dynamic if dynamic is not None else sc.defaultParallelism
    return max(1, cores // max(1, int(sc.getConf().get("spark.task.cpus", "1"))))
