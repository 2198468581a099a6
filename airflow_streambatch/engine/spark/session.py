"""The Spark session the engine runs on: starting or joining it, shipping this package
to its executors, and reading how many execution slots it offers (CPU, and the GPUs and
custom resources of its executors or workers: `profiles.py`, `cluster.py`)."""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Iterable, Iterator, Mapping

from pyspark.sql import SparkSession

from airflow_streambatch.engine.spark.cluster import standalone_workers
from airflow_streambatch.engine.spark.connect import (
    active_connect_session,
    connect_master,
    is_connect,
    local_master_cores,
)
from airflow_streambatch.engine.spark.java import ensure_java
from airflow_streambatch.engine.spark.local_gpus import check_slots, detect_local_gpus
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


def local_master(min_slots: int = 0) -> str:
    """``local[N]`` with a task slot per CPU, at least ``min_slots``."""
    return f"local[{max(os.cpu_count() or 1, int(min_slots))}]"


def get_spark(min_slots: int = 0) -> SparkSession:
    """The active SparkSession (a Spark Connect one first: `connect.py`), or a local one with at least
    ``min_slots`` task slots."""
    with _session_lock:
        active = active_connect_session() or SparkSession.getActiveSession()
        if active is not None:
            return active
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        ensure_java()
        builder = SparkSession.builder.master(local_master(min_slots)).appName("airflow-streambatch")
        with jvm_output_to_logging():
            spark = builder.config(map=SPARK_DEFAULTS).getOrCreate()
        quiet_spark_logs(spark)
        return spark


# -- the JVM's own output at its real level -------------------------------------------
# Spark's driver JVM writes its log4j lines (default pattern "%d{yy/MM/dd HH:mm:ss} %p %c{1}: %m"),
# and the JVM and Spark their start-up notices, to stderr, which Airflow's task supervisor logs
# at ERROR whatever they say: a successful run showed 5-8 red lines. `jvm_output_to_logging`
# gives the JVM a pipe for stderr instead, and a thread logs each line at the level it states.
JVM_LOG = logging.getLogger("airflow_streambatch.spark.jvm")
_LOG4J_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ([^:]*): ?(.*)$")
_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
           "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
# a stack trace's lines (and an exception's message line) belong to the log line before them
_CONTINUATION = re.compile(r"^(\s|Caused by:|Suppressed:|\.\.\. \d+ more|[\w$.]+(Exception|Error|Throwable)\b)")
# Loggers whose warnings say nothing wrong here. FairSchedulableBuilder warns for every job run in a
# pool that spark.scheduler.allocation.file does not list: the engine names a pool per operator
# (`backend.py`) on purpose, and Spark creates it with the defaults it warns about.
QUIET_LOGGERS = {"org.apache.spark.scheduler.FairSchedulableBuilder": "ERROR"}


def jvm_line_level(line: str, previous: int) -> tuple[int, str]:
    """The logging level and message of one line the JVM wrote to stderr."""
    match = _LOG4J_LINE.match(line)
    if match:
        return _LEVELS[match.group(1)], f"{match.group(2)}: {match.group(3)}"
    if _CONTINUATION.match(line):
        return previous, line
    if line.startswith("WARNING"):  # the JVM's own notices (incubator modules, illegal access)
        return logging.WARNING, line
    return logging.INFO, line  # Spark's start-up notices ("Using Spark's default log4j profile")


class _Relay(threading.Thread):
    """Logs the lines of the JVM's stderr pipe; holds them while fd 2 is still the pipe."""

    def __init__(self, read_fd: int):
        super().__init__(name="spark-jvm-stderr", daemon=True)
        self.read_fd = read_fd
        self.lock = threading.Lock()
        self.held: list[tuple[int, str]] | None = []  # None once fd 2 is restored: log at once

    def run(self) -> None:
        level = logging.INFO
        with os.fdopen(self.read_fd, "r", encoding="utf-8", errors="replace") as pipe:
            for raw in pipe:
                line = raw.rstrip()
                if line:
                    level, message = jvm_line_level(line, level)
                    with self.lock:
                        if self.held is not None:  # a handler writing to stderr would feed the pipe
                            self.held.append((level, message))
                            continue
                    JVM_LOG.log(level, "%s", message)

    def release(self) -> None:
        """fd 2 is restored: log what was held, and from now on every line as it comes."""
        with self.lock:
            held, self.held = self.held or [], None
        for level, message in held:
            JVM_LOG.log(level, "%s", message)


@contextlib.contextmanager
def jvm_output_to_logging() -> Iterator[None]:
    """A JVM that starts inside this block writes its stderr to a pipe whose lines are logged at their level.

    The JVM inherits fd 2 when PySpark launches it, so fd 2 is the pipe only for the
    block; a thread reads it for the life of the JVM (it ends at EOF, when the JVM
    exits). Lines that arrive during the block are held until fd 2 is restored, so a
    logging handler writing to stderr cannot feed the pipe. Nothing changes when this
    process already has a JVM (its stderr is whatever it got then).
    """
    from pyspark import SparkContext

    if SparkContext._gateway is not None:
        yield
        return
    read_fd, write_fd = os.pipe()
    saved = os.dup(2)
    relay = _Relay(read_fd)
    relay.start()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        relay.release()


def quiet_spark_logs(spark: SparkSession) -> None:
    """`SPARK_LOG_LEVEL` for the session's driver, and `QUIET_LOGGERS` at theirs."""
    sc = spark.sparkContext
    sc.setLogLevel(SPARK_LOG_LEVEL)
    with contextlib.suppress(Exception):  # a log4j without Configurator (a vendor's build): keep its warnings
        jvm = sc._jvm
        for name, level in QUIET_LOGGERS.items():
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
                name, jvm.org.apache.logging.log4j.Level.toLevel(level))


# Properties of the driver JVM itself: a session started in a process that already has a JVM
# (a stopped session's, or PySpark's gateway) runs in that JVM, so it cannot take them.
NEEDS_NEW_JVM = ("spark.driver.memory", "spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions",
                 "spark.driver.extraClassPath", "spark.driver.extraLibraryPath")


def apply_to_active_session(spark: SparkSession, requested: Mapping[str, str],
                            name_of: Callable[[str], str] = repr) -> None:
    """Give a running session the properties asked of it, or refuse, naming those it cannot take.

    A property the session already has is fine; a runtime one (`RuntimeConfig.isModifiable`:
    SQL properties such as ``spark.sql.shuffle.partitions``) is set; any other (a static
    property: ``spark.ui.port``, ``spark.executor.memory``, ``spark.driver.memory``, ...)
    was fixed when the session started, so asking for another value is an error, not
    something to ignore. ``name_of`` says where a property was asked for (the setting
    to change).
    """
    refused, settable = [], {}
    connect = is_connect(spark)
    for key, value in requested.items():
        current = spark.conf.get(key, None)
        if current is None and not connect:
            current = spark.sparkContext.getConf().get(key)
        if current == value:
            continue
        if spark.conf.isModifiable(key):
            settable[key] = value
            continue
        has = "no value" if current is None else repr(current)
        refused.append(f"{name_of(key)} = {value!r} (the session has {has})")
    if refused:
        if connect:
            raise ValueError(f"cannot apply {'; '.join(refused)}: the Spark Connect server's application fixed these "
                             "properties when it started, and a client can set only runtime ones. Set them on the "
                             "server, or remove them")
        sc = spark.sparkContext
        raise ValueError(f"cannot apply {'; '.join(refused)}: this process already runs a SparkSession (application "
                         f"{sc.appName}, {sc.applicationId}) and these properties are fixed when a session starts. "
                         "Remove them, or run the epoch in a process of its own (deploy_mode='spark_submit')")
    for key, value in settable.items():  # only once nothing is refused: a failed task changes nothing
        spark.conf.set(key, value)


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
    """``addPyFile`` the top-level module or package of ``module_name`` (once per application; on Spark
    Connect, once per session, as a Python artifact of the session)."""
    connect = is_connect(spark)
    owner = spark.session_id if connect else spark.sparkContext.applicationId
    top = module_name.split(".")[0]
    if (owner, top) in _shipped:
        return
    path = getattr(importlib.import_module(top), "__file__", None)
    if path is None:
        return  # a namespace package: nothing to zip
    if os.path.basename(path) == "__init__.py":
        path = _zip_package(os.path.dirname(path))
    if connect:
        spark.addArtifacts(path, pyfile=True)
    else:
        spark.sparkContext.addPyFile(path)
    _shipped.add((owner, top))


def ship_package(spark: SparkSession) -> None:
    """Make this package importable on a cluster's executors (once per application).

    Tasks run ``airflow_streambatch.engine.tasks`` on the executors' Python workers,
    so a cluster whose workers do not have the package installed gets it as a zip
    through ``addPyFile``, the way ``spark-submit --py-files`` ships code. Local
    masters share the driver's interpreter and need nothing.
    """
    if not master_of(spark).startswith("local"):
        _add_py_files(spark, "airflow_streambatch")


def master_of(spark: SparkSession) -> str:
    """The session's master URL, classic or Spark Connect."""
    return connect_master(spark) if is_connect(spark) else spark.sparkContext.master


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
    wait. Local mode counts the machine's GPUs (`local_gpus`: ``CUDA_VISIBLE_DEVICES``, else
    ``nvidia-smi``) and no other resource (``DataContext.resources`` gives them). A request for
    more than there is fails here, the error naming the setting for where Spark runs.
    """
    sc = spark.sparkContext
    requests = list(requests)
    cores = _dynamic_cluster_cores(sc, default_profile=True)
    slots: dict[str, float] = {"CPU": float(cores if cores is not None else sc.defaultParallelism)}
    names = {name for request in requests for name in spark_resources(request)}
    if is_local(sc):
        if "gpu" in names:
            slots["GPU"] = float(detect_local_gpus())
    else:
        for name, amount in (offered(sc, names) or {}).items():
            slots[engine_name(name)] = amount
    check_slots(sc.master, requests, slots)
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
    cores = local_master_cores(sc.master)
    if cores is None:
        dynamic = _dynamic_cluster_cores(sc, default_profile=False)
        cores = dynamic if dynamic is not None else sc.defaultParallelism
    return max(1, cores // max(1, int(sc.getConf().get("spark.task.cpus", "1"))))
