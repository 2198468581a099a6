"""StreamBatchHook: where an epoch's Spark application runs, and how to reach it.

Four ways, one connection:

* no connection: embedded ``local[*]`` Spark inside the Airflow task process (the
  default; a laptop needs nothing else);
* a Spark connection (``spark`` type of apache-airflow-providers-apache-spark, or this
  provider's ``streambatch`` type) in client mode in-process: the streaming scheduler
  is the Spark driver and runs in the Airflow worker, executors run on the cluster;
* the same connection through ``spark-submit`` (`SparkSubmitHook`), which runs
  `airflow_streambatch.epochs.spark_app` as the application;
* a Spark Connect server (the Spark provider's ``spark_connect`` type, or a host of
  ``sc://host:port``): the scheduler runs in the Airflow worker as a Connect client,
  and its tasks run on the server's executors (`spark_connect_session.py`).

The master is read from the connection the way `SparkSubmitHook` reads it (host with
scheme, or ``conn_type://host:port``); extras ``conf`` (a dict of Spark properties),
``deploy-mode`` and ``spark-binary`` apply to both paths.

Connection properties hold secrets (S3 keys, Azure account keys, tokens). Both paths
start a JVM through spark-submit, which would put every ``--conf k=v`` on a command
line any local user reads with ``ps`` (and SparkSubmitHook logs its command): the
properties go in a 0600 file in a private directory instead (``--properties-file``),
deleted once the JVM has read it; sensitive values are registered with Airflow's
secrets masker before anything logs, and ``spark.redaction.regex`` is extended so the
Spark UI hides account keys, SAS tokens and credentials too.

Object-store credentials come from ``storage_conn_id`` (an ``aws``,
``google_cloud_platform``, ``wasb``/``adls``/``azure_data_lake`` connection, or a Spark
connection's ``storage`` extra; `object_store.py` maps them to the variables the clients
read): `object_store_credentials` sets them in this process for the epoch and gives them
to the executors as ``spark.executorEnv.<NAME>`` properties, through the same file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from functools import cached_property

from airflow.sdk import BaseHook
from airflow.sdk.configuration import conf as airflow_conf

from airflow_streambatch.engine.atomic_files import atomic_write
from airflow_streambatch.engine.spark.connect import worker_environment
from airflow_streambatch.engine.spark.java import ensure_java
from airflow_streambatch.engine.spark.session import (
    NEEDS_NEW_JVM,
    apply_to_active_session,
    jvm_output_to_logging,
    local_master,
    quiet_spark_logs,
    with_spark_defaults,
)
from airflow_streambatch.hooks.lineage_conf import openlineage_spark_properties
from airflow_streambatch.hooks.network_extra import network_settings
from airflow_streambatch.hooks.object_store import ObjectStoreHook, StoreEnvironment, applied
from airflow_streambatch.hooks.spark_connect_session import SPARK_CONNECT_CONN_TYPE, connect_session, connect_url
from airflow_streambatch.hooks.spark_properties import SENSITIVE, mask_sensitive, properties_file

SUBMIT_GRACE_S = 3.0  # how long spark-submit's driver gets to record an interruption (Airflow's kill: 5 s)


class StreamBatchHook(BaseHook):
    """Gives the engine a SparkSession (embedded or a cluster's), or runs an epoch via spark-submit.

    :param streambatch_conn_id: a Spark connection; None runs embedded local Spark.
    :param spark_conf: Spark properties on top of the connection's ``conf`` extra.
    :param app_name: the Spark application name (shown in the Spark UI).
    :param storage_conn_id: a connection holding object-store credentials (`object_store.py`); None uses the
        Spark connection's ``storage`` extra if it has one, else whatever the processes' environment holds.
    """

    conn_name_attr = "streambatch_conn_id"
    default_conn_name = "streambatch_default"
    conn_type = "streambatch"
    hook_name = "Streaming batch on Spark"

    def __init__(self, streambatch_conn_id: str | None = None, *, spark_conf: dict | None = None,
                 app_name: str = "airflow-streambatch", storage_conn_id: str | None = None) -> None:
        super().__init__()
        self.streambatch_conn_id = streambatch_conn_id
        self.spark_conf = dict(spark_conf or {})
        self.app_name = app_name
        self.storage_conn_id = storage_conn_id
        self._executor_env: dict[str, str] = {}  # while `object_store_credentials` is active
        # id(environment) -> (a Python workers' environment we changed, what it had before)
        self._worker_env_before: dict[int, tuple[dict, dict[str, str | None]]] = {}

    @cached_property
    def master(self) -> str | None:
        """The Spark master URL, or None for embedded local Spark."""
        if self.streambatch_conn_id is None:
            return None
        conn = self.get_connection(self.streambatch_conn_id)
        if not conn.host:
            raise ValueError(f"connection {self.streambatch_conn_id!r} has no host: set it to the Spark master, "
                             "e.g. spark://spark-master:7077, yarn, k8s://https://host:443 or local[4]")
        if conn.conn_type in ("spark", "streambatch") and ("://" in conn.host or not conn.port):
            master = conn.host
        else:
            master = f"{conn.conn_type}://{conn.host}"
        return f"{master}:{conn.port}" if conn.port else master

    @cached_property
    def connect_url(self) -> str | None:
        """The Spark Connect URL (``sc://``) of the connection, None for a classic master (`spark_connect_session`)."""
        if self.streambatch_conn_id is None:
            return None
        conn = self.get_connection(self.streambatch_conn_id)
        return connect_url(self.streambatch_conn_id, conn.conn_type,
                           None if conn.conn_type == SPARK_CONNECT_CONN_TYPE else self.master)

    @cached_property
    def extras(self) -> dict:
        if self.streambatch_conn_id is None:
            return {}
        return self.get_connection(self.streambatch_conn_id).extra_dejson

    @property
    def event_log_dir(self) -> str | None:
        """Where Spark writes its event log (for a History Server): the connection's ``event-log-dir``
        extra, else ``[streambatch] spark_event_log_dir``; None (the default) writes none."""
        return (self.extras.get("event-log-dir")
                or airflow_conf.get("streambatch", "spark_event_log_dir", fallback="") or None)

    @cached_property
    def network_settings(self) -> dict:
        """`DataContext` network settings (ports, TLS files) from the connection's ``network`` extra."""
        return network_settings(self.extras, self.streambatch_conn_id)

    @property
    def history_server_url(self) -> str | None:
        """The Spark History Server reading `event_log_dir`: the connection's ``history-server-url`` extra,
        else ``[streambatch] spark_history_server_url``; the Spark UI link points there once the task ends."""
        url = self.extras.get("history-server-url") or airflow_conf.get("streambatch", "spark_history_server_url",
                                                                        fallback="")
        return url.rstrip("/") or None

    def _prepare_event_log_dir(self) -> None:
        """Create a local event log directory, private (0700: the logs hold the plans and properties of every
        job), as Spark refuses to start with one that does not exist. Remote ones (s3a://...) are left alone."""
        directory = self.event_log_dir
        if directory and (directory.startswith("file:") or "://" not in directory):
            path = directory.removeprefix("file://").removeprefix("file:")
            if not os.path.isdir(path):
                os.makedirs(path, mode=0o700, exist_ok=True)

    @property
    def conf(self) -> dict[str, str]:
        """Spark properties: the connection's ``conf`` extra, then ``spark_conf``, then the executors' Python.

        Executors start ``python3`` unless told otherwise, which on a cluster is rarely
        the interpreter that has pyarrow and the pipeline's packages: default to this
        worker's interpreter (the compose file's images put it at the same path);
        override with ``spark.pyspark.python`` in the connection. ``spark.redaction.regex``
        gains `SENSITIVE` (a regex of the connection's own is kept, ours added to it), and
        sensitive values are registered with Airflow's secrets masker on every read, so
        they are masked before any log line can carry them.
        """
        conf = self.requested_conf
        conf.setdefault("spark.pyspark.python", os.environ.get("PYSPARK_PYTHON", sys.executable))
        if self.event_log_dir and "spark.eventLog.enabled" not in conf:  # an explicit setting wins
            conf.update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": self.event_log_dir})
        for key, value in self._executor_env.items():  # an explicit property of the same name wins
            conf.setdefault(f"spark.executorEnv.{key}", value)
            if self.extras.get("deploy-mode") == "cluster":  # spark-submit's driver runs on the cluster too
                conf.setdefault(f"spark.yarn.appMasterEnv.{key}", value)
                conf.setdefault(f"spark.kubernetes.driverEnv.{key}", value)
        conf.update(openlineage_spark_properties(conf))  # the task as the Spark application's parent job
        own = conf.get("spark.redaction.regex")
        conf["spark.redaction.regex"] = f"{own}|{SENSITIVE}" if own else SENSITIVE
        mask_sensitive(conf)
        return conf

    # -- object-store credentials --------------------------------------------------------
    def store_environment(self) -> StoreEnvironment | None:
        """The object-store environment of ``storage_conn_id``, else of the Spark connection's ``storage``
        extra; None when neither gives one (the processes' own environment applies). Secrets are masked."""
        conn_id = self.storage_conn_id
        if conn_id is None and self.streambatch_conn_id is not None and self.extras.get("storage"):
            conn_id = self.streambatch_conn_id
        return ObjectStoreHook(conn_id).store_environment() if conn_id is not None else None

    @contextlib.contextmanager
    def object_store_credentials(self) -> Iterator[dict[str, str | None]]:
        """The connection's object-store credentials, in every process of the epoch, for the block.

        * this process (the driver: listings, commit records, leases): ``os.environ``,
          put back as it was on exit (`object_store.applied`);
        * Spark's executors: ``spark.executorEnv.<NAME>`` properties of a session or a
          spark-submit started inside the block (`conf`, through the properties file), and
          the SparkContext's ``environment`` (what PySpark gives every Python worker it
          launches) of a session `get_spark_session` returns inside it, a running one
          included: restored on exit;
        * ``deploy_mode="spark_submit"``: spark-submit inherits ``os.environ``.

        A GCP key file written for the run is for this host only: executors of a cluster
        do not get its path (give them ``key_path`` to a file they have, or their own
        credentials). Yields the variables as set here; nothing when no connection gives any.
        """
        store = self.store_environment()
        if store is None:
            yield {}
            return
        with applied(store) as variables:
            self.log.info("Object-store credentials from connection %s: %s for this task and Spark's executors",
                          store.conn_id, ", ".join(sorted(k for k, v in variables.items() if v is not None)))
            local = self.master is None or self.master.startswith("local")
            self._executor_env = {k: v for k, v in variables.items()
                                  if v is not None and (local or k not in store.host_local)}
            try:
                yield variables
            finally:
                self._executor_env = {}
                for environment, previous in self._worker_env_before.values():
                    for key, value in previous.items():
                        if value is None:
                            environment.pop(key, None)
                        else:
                            environment[key] = value
                self._worker_env_before = {}

    def _give_workers_the_store_environment(self, environment: dict) -> None:
        """Python workers get ``sc.environment`` with every job (PySpark fills it from ``spark.executorEnv.*``
        when the context starts), and a Spark Connect session's engine tasks `connect.worker_environment`:
        set the credentials there for a session that started without them."""
        if not self._executor_env or id(environment) in self._worker_env_before:
            return
        self._worker_env_before[id(environment)] = (environment, {k: environment.get(k) for k in self._executor_env})
        environment.update(self._executor_env)

    @property
    def requested_conf(self) -> dict[str, str]:
        """The Spark properties someone asked for: the connection's ``conf`` extra, then ``spark_conf``."""
        conf = {str(k): str(v) for k, v in (self.extras.get("conf") or {}).items()}
        conf.update({str(k): str(v) for k, v in self.spark_conf.items()})
        return conf

    def get_spark_session(self):
        """The SparkSession of this task: embedded local Spark, or a client-mode driver for the connection's master.

        Both start with the connection's ``conf``, ``spark_conf`` and ``app_name``
        (embedded Spark too: ``spark.driver.memory`` or ``spark.ui.port`` given to the
        operator reach the session). An active session in the process (a notebook, a
        test) is reused: what can still change in it (runtime SQL properties) is set,
        and a requested property it cannot take (a static one, set differently when it
        started) fails the task naming it, instead of being silently ignored.

        The properties reach the driver JVM in a properties file (PySpark passes builder
        options to spark-submit as argv); when this process already has a JVM gateway
        they go over its socket instead, which no other user can read, and properties of
        the JVM itself are refused (`NEEDS_NEW_JVM`).
        """
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        connect = connect_session(self.connect_url, self.requested_conf, self._setting_name, self.log)
        if connect is not None:
            self._give_workers_the_store_environment(worker_environment(connect))
            return connect
        active = SparkSession.getActiveSession()
        if active is not None:
            apply_to_active_session(active, self.requested_conf, self._setting_name)
            self._give_workers_the_store_environment(active.sparkContext.environment)
            self.log.info("Using the SparkSession already running in this process: application %s (%s, master %s)",
                          active.sparkContext.appName, active.sparkContext.applicationId, active.sparkContext.master)
            return active
        master = self.master or local_master()
        conf = with_spark_defaults(self.conf)
        self._prepare_event_log_dir()
        os.environ.setdefault("PYSPARK_PYTHON", conf["spark.pyspark.python"])
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        ensure_java()
        builder = SparkSession.builder.master(master).appName(self.app_name)
        where = f"connection {self.streambatch_conn_id}" if self.streambatch_conn_id else "embedded, no connection"
        self.log.info("Starting Spark: application %s, master %s (%s); the driver JVM takes a while to start",
                      self.app_name, master, where)
        started = time.monotonic()
        if SparkContext._gateway is not None:
            refused = sorted(set(self.requested_conf) & set(NEEDS_NEW_JVM))
            if refused:
                raise ValueError(f"{', '.join(self._setting_name(k) for k in refused)}: cannot apply, this process "
                                 "already has a Spark driver JVM, and these are properties of the JVM itself. "
                                 "Remove them, or run the epoch in a process of its own (deploy_mode='spark_submit')")
            for key, value in conf.items():
                builder = builder.config(key, value)
            spark = builder.getOrCreate()
        else:
            spark = self._start_driver_jvm(builder, conf)
        quiet_spark_logs(spark)
        sc = spark.sparkContext
        self._give_workers_the_store_environment(sc.environment)
        self.log.info("Spark is up after %.1f s: application %s (%s), master %s, Spark UI %s",
                      time.monotonic() - started, sc.appName, sc.applicationId, sc.master, sc.uiWebUrl or "disabled")
        return spark

    def _setting_name(self, key: str) -> str:
        """Where a requested property came from, for error messages: the setting to change."""
        if key in self.spark_conf:
            return f"spark_conf[{key!r}]"
        return f"the conf extra of connection {self.streambatch_conn_id!r}: {key!r}"

    def _start_driver_jvm(self, builder, conf: dict[str, str]):
        previous = os.environ.get("PYSPARK_SUBMIT_ARGS")
        with properties_file(conf) as path, jvm_output_to_logging():
            # before any arguments of the user's own (which end in pyspark-shell)
            os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {shlex.quote(path)} {previous or 'pyspark-shell'}"
            try:
                return builder.getOrCreate()
            finally:
                if previous is None:
                    os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
                else:
                    os.environ["PYSPARK_SUBMIT_ARGS"] = previous

    def submit_epoch(self, spec: dict, *, python_path: list[str] | None = None, **submit_kwargs) -> None:
        """Run one epoch as a spark-submit application (`airflow_streambatch.epochs.spark_app`).

        ``python_path`` is prepended to the driver's PYTHONPATH (the DAG folder, so
        the pipeline module imports). The outcome is the epoch record the run leaves
        next to the output; spark-submit's exit status says only whether it broke.
        """
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from airflow_streambatch.epochs import spark_app

        if self.streambatch_conn_id is None:
            raise ValueError("deploy_mode='spark_submit' needs streambatch_conn_id: a Spark connection whose host is "
                             "the master (local[*] for this machine); without one the operator runs in-process")
        if self.connect_url is not None:
            raise ValueError(f"deploy_mode='spark_submit' starts a Spark application of its own, and connection "
                             f"{self.streambatch_conn_id!r} is a Spark Connect server, whose application is already "
                             "running: use deploy_mode='in_process' (the engine runs as its client)")
        bin_dir = os.path.dirname(sys.executable)  # pip's pyspark puts spark-submit next to the interpreter
        env = {
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
            "PYSPARK_PYTHON": self.conf["spark.pyspark.python"],
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join([*(python_path or []), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
        ensure_java()  # sets JAVA_HOME in this process's environment, which spark-submit inherits
        conf = with_spark_defaults(self.conf)  # masks the secrets before SparkSubmitHook logs anything
        self._prepare_event_log_dir()
        with properties_file(conf) as props:
            spec_path = os.path.join(os.path.dirname(props), "epoch.json")
            atomic_write(spec_path, json.dumps(spec))
            hook = SparkSubmitHook(conn_id=self.streambatch_conn_id, conf={}, properties_file=props,
                                   name=self.app_name, application_args=[spec_path], env_vars=env, **submit_kwargs)
            self.submit_hook = hook  # `stop_submitted` stops a cluster-mode driver through it
            hook.submit(application=os.path.abspath(spark_app.__file__))

    def stop_submitted(self, grace_s: float = SUBMIT_GRACE_S) -> None:
        """Stop the spark-submit application `submit_epoch` started, so that its driver records why.

        The Python driver (spark-submit's child, running ``spark_app.py``) gets SIGTERM,
        which ``spark_app`` turns into an exception: the engine cancels its jobs and
        removes its staging and blocks, the record says the epoch was terminated, and
        spark-submit exits with it. What is still running after ``grace_s`` is killed;
        the SparkSubmitHook's ``on_kill`` then stops a cluster-mode driver.
        """
        import psutil

        from airflow_streambatch.epochs import spark_app

        app = os.path.abspath(spark_app.__file__)
        procs = []
        for proc in psutil.Process().children(recursive=True):  # what this process started: never another task's
            with contextlib.suppress(psutil.Error):
                if app in proc.cmdline():
                    procs.append(proc)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                if "org.apache.spark.deploy.SparkSubmit" not in proc.cmdline():  # the Python driver, not the JVM
                    proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if getattr(self, "submit_hook", None) is not None:
            self.submit_hook.on_kill()
