"""Secrets in a connection's Spark ``conf`` stay off command lines, out of logs and out of
the Spark UI, in both deploy modes (issue 12, #16).

Any local user reads every process's argv (``ps``); spark-submit and PySpark's gateway
launch take Spark properties as ``--conf k=v`` argv, and SparkSubmitHook logs its command.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request
from datetime import datetime, timezone

from argv_watcher import ArgvWatcher
from pipelines import write_inputs

HERE = os.path.dirname(os.path.abspath(__file__))
S3_PROP, S3_KEY = "spark.hadoop.fs.s3a.access.key", "AKIAS3ACCESSKEYSECRET42"
AZ_PROP = "spark.hadoop.fs.azure.account.key.acct42.dfs.core.windows.net"
AZ_KEY = "QXp1cmVBY2NvdW50S2V5U2VjcmV0+/42=="  # base64 with '+', '/' and '=': escaped in the file
SECRETS = (S3_KEY.encode(), AZ_KEY.encode())


def _connection(master: str) -> str:
    return json.dumps({"conn_type": "spark", "host": master, "extra": {"conf": {
        S3_PROP: S3_KEY, AZ_PROP: AZ_KEY, "spark.ui.enabled": "true", "spark.ui.port": "0"}}})


def spark_report(sc) -> dict:
    """What the driver holds: the connection's properties, and the Spark UI's environment page."""
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/environment"
    with urllib.request.urlopen(url, timeout=30) as response:
        environment = response.read().decode()
    conf = sc.getConf()
    return {"s3": conf.get(S3_PROP), "azure": conf.get(AZ_PROP), "ui_environment": environment}


def record_conf(ds, epoch, *, report: str):
    """A pipeline (run by spark-submit's driver) that records what its SparkContext holds."""
    from pyspark.sql import SparkSession

    with open(report, "w") as f:
        json.dump(spark_report(SparkSession.getActiveSession().sparkContext), f)
    return ds


def _assert_redacted_everywhere(report: dict):
    assert report["s3"] == S3_KEY and report["azure"] == AZ_KEY  # the properties did reach the driver
    assert S3_KEY not in report["ui_environment"] and AZ_KEY not in report["ui_environment"]
    environment = {k: v for k, v in json.loads(report["ui_environment"])["sparkProperties"]}
    assert environment[AZ_PROP] == environment[S3_PROP] == "*********(redacted)"


def test_spark_submit_keeps_secrets_off_command_lines_logs_and_the_spark_ui(monkeypatch, tmp_path, caplog, capfd):
    from airflow.sdk._shared.secrets_masker import redact

    from airflow_streambatch.epochs import EpochManifest, list_inputs
    from airflow_streambatch.epochs.job import EpochJob
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    monkeypatch.setenv("AIRFLOW_CONN_SB_SECRETS", _connection("local[1]"))
    write_inputs(tmp_path / "in", partitions=1)
    end = datetime(2026, 11, 22, 11, tzinfo=timezone.utc).isoformat()
    manifest = EpochManifest("2026-11-22T10:00:00+00:00", end, list_inputs(str(tmp_path / "in")))
    job = EpochJob(pipeline="test_connection_secrets:record_conf", manifest=manifest,
                   output_path=str(tmp_path / "out"), pipeline_kwargs={"report": str(tmp_path / "report.json")})
    spec = job.to_spec()
    with ArgvWatcher(SECRETS) as watcher, caplog.at_level(logging.DEBUG):
        StreamBatchHook("sb_secrets").submit_epoch(spec, python_path=[HERE])
    assert watcher.spark_submit_jvms, "never saw the spark-submit JVM"
    assert not watcher.leaked
    watcher.private_properties_text()  # 0600 while it existed, deleted after the run
    logged = caplog.text + "".join(capfd.readouterr())
    assert "Spark-Submit cmd" in logged and S3_KEY not in logged and AZ_KEY not in logged
    assert S3_KEY not in redact(f"key={S3_KEY}") and AZ_KEY not in redact(f"key={AZ_KEY}")  # masked in task logs
    _assert_redacted_everywhere(json.loads((tmp_path / "report.json").read_text()))


CLIENT_MODE = """
import json, os, sys
from pyspark import SparkContext
from airflow_streambatch.hooks.streambatch import StreamBatchHook
from test_connection_secrets import spark_report

spark = StreamBatchHook("sb_secrets").get_spark_session()
with open(f"/proc/{SparkContext._gateway.proc.pid}/cmdline", "rb") as f:
    argv = f.read().decode()
report = spark_report(spark.sparkContext)
spark.stop()
print(json.dumps({**report, "gateway_argv": argv, "submit_args": os.environ.get("PYSPARK_SUBMIT_ARGS")}))
"""


def test_client_mode_driver_gets_secrets_off_its_jvm_command_line(tmp_path):
    """The in-process driver (a separate process here: the test session already has a JVM)."""
    env = dict(os.environ, AIRFLOW_CONN_SB_SECRETS=_connection("local[1]"))
    env["PYTHONPATH"] = os.pathsep.join([HERE, env.get("PYTHONPATH", "")])
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run([sys.executable, "-c", CLIENT_MODE], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "org.apache.spark.deploy.SparkSubmit" in report["gateway_argv"]
    assert S3_KEY not in report["gateway_argv"] and AZ_KEY not in report["gateway_argv"]
    assert report["submit_args"] is None  # the properties file was the driver's only, and is gone
    _assert_redacted_everywhere(report)
