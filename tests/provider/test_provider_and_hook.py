"""Provider registration, the hook's connections, and the operator's argument checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

AIRFLOW = os.path.join(os.path.dirname(sys.executable), "airflow")


def test_airflow_lists_the_provider_and_its_extra_links(airflow_db):
    listed = subprocess.run([AIRFLOW, "providers", "list", "--output", "json"], capture_output=True, text=True,
                            check=True).stdout
    ours = [p for p in json.loads(listed) if p["package_name"] == "airflow-streambatch"]
    assert ours and ours[0]["version"]
    links = subprocess.run([AIRFLOW, "providers", "links", "--output", "json"], capture_output=True, text=True,
                           check=True).stdout
    names = {link["extra_link_class_name"] for link in json.loads(links)}
    assert {"airflow_streambatch.operators.links.SparkUILink",
            "airflow_streambatch.operators.links.EpochOutputLink"} <= names


@pytest.mark.parametrize(("uri_or_json", "master"), [
    ("spark://spark-master:7077", "spark://spark-master:7077"),  # URI form: conn_type is the scheme
    ('{"conn_type": "spark", "host": "k8s://https://kube:443"}', "k8s://https://kube:443"),  # UI form
    ('{"conn_type": "spark", "host": "yarn"}', "yarn"),
    ('{"conn_type": "streambatch", "host": "local[2]"}', "local[2]"),
])
def test_hook_reads_the_master_from_a_spark_connection(monkeypatch, uri_or_json, master):
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    monkeypatch.setenv("AIRFLOW_CONN_SB_TEST", uri_or_json)
    assert StreamBatchHook("sb_test").master == master


def test_hook_conf_layers_connection_then_operator_and_names_the_executor_python(monkeypatch):
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    monkeypatch.setenv("AIRFLOW_CONN_SB_TEST", json.dumps({
        "conn_type": "spark", "host": "spark://m:7077",
        "extra": {"conf": {"spark.executor.memory": "4g", "spark.executor.cores": 2}}}))
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    conf = StreamBatchHook("sb_test", spark_conf={"spark.executor.memory": "8g"}).conf
    assert conf["spark.executor.memory"] == "8g" and conf["spark.executor.cores"] == "2"
    assert conf["spark.pyspark.python"] == sys.executable
    assert StreamBatchHook(None).master is None  # embedded local Spark


def test_hook_refuses_a_connection_without_master_and_spark_submit_without_connection(monkeypatch):
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    monkeypatch.setenv("AIRFLOW_CONN_SB_TEST", json.dumps({"conn_type": "spark"}))
    with pytest.raises(ValueError, match="has no host: set it to the Spark master"):
        _ = StreamBatchHook("sb_test").master
    with pytest.raises(ValueError, match="needs streambatch_conn_id"):
        StreamBatchHook(None).submit_epoch({})


def test_embedded_hook_hands_the_engine_the_active_session(spark):
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    assert StreamBatchHook(None).get_spark_session() is spark


def test_operator_checks_its_arguments_when_the_dag_is_parsed():
    from airflow_streambatch.operators.streambatch import StreamBatchOperator

    with pytest.raises(ValueError, match="deploy_mode='yarn'"):
        StreamBatchOperator(task_id="t", pipeline="m:f", output_path="/o", deploy_mode="yarn")
    with pytest.raises(ValueError, match="output_format='avro'"):
        StreamBatchOperator(task_id="t", pipeline="m:f", output_path="/o", output_format="avro")
    with pytest.raises(ValueError, match="pass it as 'module:function'"):
        StreamBatchOperator(task_id="t", pipeline=len, output_path="/o", deploy_mode="spark_submit")
    with pytest.raises(TypeError):
        StreamBatchOperator("t", pipeline="m:f", output_path="/o")  # keyword-only
    op = StreamBatchOperator(task_id="t", pipeline="m:f", output_path="/o")
    assert {"pipeline", "output_path", "manifest", "pipeline_kwargs", "full_recompute"} <= set(op.template_fields)


def test_sensor_checks_its_frontier_arguments():
    from airflow_streambatch.sensors.epoch import EpochSensor

    with pytest.raises(ValueError, match="frontier='eventually'"):
        EpochSensor(task_id="s", input_path="/in", frontier="eventually")
    with pytest.raises(ValueError, match="needs watermark_path"):
        EpochSensor(task_id="s", input_path="/in", frontier="watermark")
