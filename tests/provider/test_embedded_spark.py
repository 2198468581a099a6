"""Embedded mode (no connection) honours ``spark_conf`` and ``app_name``, or refuses by name what cannot apply.

A session the hook starts gets them all; a session already running in the process (this
test session's) takes runtime SQL properties, and a static property it holds otherwise
fails with the setting's name; so does a property of the driver JVM once the process
has a JVM. The fresh session runs in a process of its own: this one already has a JVM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ports import free_port

FRESH = """
import json, sys
from airflow_streambatch.hooks.streambatch import StreamBatchHook

port = sys.argv[1]
hook = StreamBatchHook(None, app_name="my-embedded-app",
                       spark_conf={"spark.ui.port": port, "spark.sql.shuffle.partitions": "7",
                                   "spark.streambatch.custom": "yes", "spark.driver.memory": "700m"})
spark = hook.get_spark_session()
sc = spark.sparkContext
conf = sc.getConf()
report = {"app": sc.appName, "master": sc.master, "ui": sc.uiWebUrl, "custom": conf.get("spark.streambatch.custom"),
          "shuffle": spark.conf.get("spark.sql.shuffle.partitions"), "driver_memory": conf.get("spark.driver.memory"),
          "heap_mb": sc._jvm.java.lang.Runtime.getRuntime().maxMemory() // (1 << 20),
          "scheduler": conf.get("spark.scheduler.mode")}
spark.stop()
try:  # the JVM outlives the stopped session: a new session cannot resize its heap
    StreamBatchHook(None, spark_conf={"spark.driver.memory": "2g"}).get_spark_session()
    report["refused"] = None
except ValueError as exc:
    report["refused"] = str(exc)
print("REPORT " + json.dumps(report))
"""


def test_an_embedded_session_gets_the_operators_spark_conf_and_app_name(tmp_path):
    port = free_port()
    env = dict(os.environ)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run([sys.executable, "-c", FRESH, str(port)], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("REPORT "))[7:])
    assert report["app"] == "my-embedded-app" and report["master"].startswith("local[")
    assert report["ui"].endswith(f":{port}")
    assert report["custom"] == "yes" and report["shuffle"] == "7" and report["driver_memory"] == "700m"
    assert report["heap_mb"] <= 700  # the JVM did start with it (the 1g default gives about 1024)
    assert report["scheduler"] == "FAIR"  # the engine's defaults still apply under the user's
    assert "spark_conf['spark.driver.memory']" in report["refused"]
    assert "already has a Spark driver JVM" in report["refused"]


def test_a_running_session_takes_runtime_properties_and_refuses_static_ones_by_name(spark):
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    before = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        hook = StreamBatchHook(None, spark_conf={"spark.sql.shuffle.partitions": "13", "spark.scheduler.mode": "FAIR"})
        assert hook.get_spark_session() is spark
        assert spark.conf.get("spark.sql.shuffle.partitions") == "13"  # set; FAIR it already had
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)

    hook = StreamBatchHook(None, spark_conf={"spark.ui.port": "4999", "spark.executor.memory": "3g",
                                             "spark.sql.shuffle.partitions": "5"})
    with pytest.raises(ValueError) as refused:
        hook.get_spark_session()
    message = str(refused.value)
    assert "spark_conf['spark.ui.port'] = '4999'" in message and "spark_conf['spark.executor.memory']" in message
    assert "shuffle" not in message and "deploy_mode='spark_submit'" in message
    assert spark.conf.get("spark.sql.shuffle.partitions") == before  # nothing applied when something is refused


def test_a_connections_conf_is_named_when_refused(spark, monkeypatch):
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    monkeypatch.setenv("AIRFLOW_CONN_SB_LOCAL_CONF", json.dumps(
        {"conn_type": "spark", "host": "local[2]", "extra": {"conf": {"spark.ui.port": "4998"}}}))
    with pytest.raises(ValueError, match="the conf extra of connection 'sb_local_conf': 'spark.ui.port'"):
        StreamBatchHook("sb_local_conf").get_spark_session()
