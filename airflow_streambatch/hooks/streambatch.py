"""StreamBatchHook: where an epoch's Spark application runs, and how to reach it.

Three ways, one connection:

* no connection: embedded ``local[*]`` Spark inside the Airflow task process (the
  default; a laptop needs nothing else);
* a Spark connection (``spark`` type of apache-airflow-providers-apache-spark, or this
  provider's ``streambatch`` type) in client mode in-process: the streaming scheduler
  is the Spark driver and runs in the Airflow worker, executors run on the cluster;
* the same connection through ``spark-submit`` (`SparkSubmitHook`), which runs
  `airflow_streambatch.epochs.spark_app` as the application.

The master is read from the connection the way `SparkSubmitHook` reads it (host with
scheme, or ``conn_type://host:port``); extras ``conf`` (a dict of Spark properties),
``deploy-mode`` and ``spark-binary`` apply to both paths.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from functools import cached_property
from typing import Any

from airflow.sdk import BaseHook

from airflow_streambatch.engine.java import ensure_java
from airflow_streambatch.engine.spark_backend import get_spark


class StreamBatchHook(BaseHook):
    """Gives the engine a SparkSession (embedded or a cluster's), or runs an epoch via spark-submit.

    :param streambatch_conn_id: a Spark connection; None runs embedded local Spark.
    :param spark_conf: Spark properties on top of the connection's ``conf`` extra.
    :param app_name: the Spark application name (shown in the Spark UI).
    """

    conn_name_attr = "streambatch_conn_id"
    default_conn_name = "streambatch_default"
    conn_type = "streambatch"
    hook_name = "Streaming batch on Spark"

    def __init__(self, streambatch_conn_id: str | None = None, *, spark_conf: dict | None = None,
                 app_name: str = "airflow-streambatch") -> None:
        super().__init__()
        self.streambatch_conn_id = streambatch_conn_id
        self.spark_conf = dict(spark_conf or {})
        self.app_name = app_name

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden-fields": ["schema", "login", "password"],
            "relabeling": {"host": "Master (spark://host, yarn, k8s://https://host, local[4])"},
            "placeholders": {"extra": json.dumps({"conf": {"spark.executor.memory": "4g"}, "deploy-mode": "client"})},
        }

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
    def extras(self) -> dict:
        if self.streambatch_conn_id is None:
            return {}
        return self.get_connection(self.streambatch_conn_id).extra_dejson

    @property
    def conf(self) -> dict[str, str]:
        """Spark properties: the connection's ``conf`` extra, then ``spark_conf``, then the executors' Python.

        Executors start ``python3`` unless told otherwise, which on a cluster is rarely
        the interpreter that has pyarrow and the pipeline's packages: default to this
        worker's interpreter (the compose file's images put it at the same path);
        override with ``spark.pyspark.python`` in the connection.
        """
        conf = {str(k): str(v) for k, v in (self.extras.get("conf") or {}).items()}
        conf.update({str(k): str(v) for k, v in self.spark_conf.items()})
        conf.setdefault("spark.pyspark.python", os.environ.get("PYSPARK_PYTHON", sys.executable))
        return conf

    def get_spark_session(self):
        """The SparkSession of this task: embedded local Spark, or a client-mode driver for the connection's master.

        An active session in the process (a notebook, a test) is reused as is.
        """
        from pyspark.sql import SparkSession

        if SparkSession.getActiveSession() is not None or self.master is None:
            return get_spark()
        os.environ.setdefault("PYSPARK_PYTHON", self.conf["spark.pyspark.python"])
        ensure_java()
        builder = SparkSession.builder.master(self.master).appName(self.app_name)
        for key, value in {"spark.scheduler.mode": "FAIR", "spark.ui.showConsoleProgress": "false",
                           **self.conf}.items():
            builder = builder.config(key, value)
        self.log.info("Starting Spark driver for master %s (connection %s)", self.master, self.streambatch_conn_id)
        return builder.getOrCreate()

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
        bin_dir = os.path.dirname(sys.executable)  # pip's pyspark puts spark-submit next to the interpreter
        env = {
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
            "PYSPARK_PYTHON": self.conf["spark.pyspark.python"],
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join([*(python_path or []), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
        ensure_java()  # sets JAVA_HOME in this process's environment, which spark-submit inherits
        with tempfile.NamedTemporaryFile("w", prefix="streambatch-epoch-", suffix=".json", delete=False) as f:
            json.dump(spec, f)
        try:
            hook = SparkSubmitHook(conn_id=self.streambatch_conn_id, conf=self.conf, name=self.app_name,
                                   application_args=[f.name], env_vars=env, **submit_kwargs)
            hook.submit(application=os.path.abspath(spark_app.__file__))
        finally:
            os.unlink(f.name)
