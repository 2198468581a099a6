"""The hooks apply a connection's object-store credentials (issue 27, item 3): masked as soon as they
are read, set in the driver's process and given to Spark's executors for a block only, hidden
in the Spark UI; the operator and the sensor take ``storage_conn_id``, and the trigger gets only
its id."""

from __future__ import annotations

import json
import os
import uuid

import pytest


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                  "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_CONNECTION_STRING"])
def test_the_spark_ui_redacts_the_executor_environment_of_every_secret(name):
    from airflow_streambatch.hooks.spark_properties import _SENSITIVE

    assert _SENSITIVE.search(f"spark.executorEnv.{name}")
    assert _SENSITIVE.search(f"spark.yarn.appMasterEnv.{name}")


@pytest.mark.parametrize("name", ["AWS_ENDPOINT_URL", "AWS_REGION", "AZURE_STORAGE_ACCOUNT_NAME",
                                  "GOOGLE_CLOUD_PROJECT", "PYSPARK_PYTHON"])
def test_the_spark_ui_still_shows_what_is_not_secret(name):
    from airflow_streambatch.hooks.spark_properties import _SENSITIVE

    assert not _SENSITIVE.search(f"spark.executorEnv.{name}")


def test_reading_the_connection_masks_its_secrets_in_task_logs(monkeypatch):
    from airflow.sdk._shared.secrets_masker import redact

    from airflow_streambatch.hooks.object_store import ObjectStoreHook

    secret, token = f"Secret+{uuid.uuid4().hex}/Key==", f"Token{uuid.uuid4().hex}"
    monkeypatch.setenv("AIRFLOW_CONN_SB_MASKED", json.dumps({
        "conn_type": "aws", "login": "AKIAMASKTEST", "password": secret, "extra": {"aws_session_token": token}}))
    ObjectStoreHook("sb_masked").store_environment()
    assert secret not in redact(f"key={secret}") and token not in redact(f"token {token}")


def test_the_hook_sets_the_driver_and_executor_environment_for_the_block_only(monkeypatch):
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    monkeypatch.setenv("AIRFLOW_CONN_SB_STORE", json.dumps({
        "conn_type": "aws", "login": "AKIAHOOKTEST", "password": "hook-secret",
        "extra": {"region_name": "eu-north-1"}}))
    monkeypatch.setenv("AIRFLOW_CONN_SB_CLUSTER", json.dumps({
        "conn_type": "spark", "host": "spark://m:7077", "extra": {"deploy-mode": "cluster"}}))
    monkeypatch.setenv("AWS_SESSION_TOKEN", "ambient-token")
    before = dict(os.environ)
    hook = StreamBatchHook("sb_cluster", storage_conn_id="sb_store",
                           spark_conf={"spark.executorEnv.AWS_REGION": "explicit-wins"})
    with hook.object_store_credentials():
        assert os.environ["AWS_ACCESS_KEY_ID"] == "AKIAHOOKTEST" and "AWS_SESSION_TOKEN" not in os.environ
        conf = hook.conf
        assert conf["spark.executorEnv.AWS_SECRET_ACCESS_KEY"] == "hook-secret"
        assert conf["spark.executorEnv.AWS_REGION"] == "explicit-wins"
        assert conf["spark.yarn.appMasterEnv.AWS_SECRET_ACCESS_KEY"] == "hook-secret"  # cluster deploy mode
        assert conf["spark.kubernetes.driverEnv.AWS_ACCESS_KEY_ID"] == "AKIAHOOKTEST"
        assert "spark.executorEnv.AWS_SESSION_TOKEN" not in conf  # removal is for this process only
    assert dict(os.environ) == before
    assert [k for k in hook.conf if "Env." in k] == ["spark.executorEnv.AWS_REGION"]  # only the user's own


def test_a_gcp_key_file_path_is_not_given_to_executors_on_other_hosts(monkeypatch):
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    monkeypatch.setenv("AIRFLOW_CONN_SB_GCP", json.dumps({
        "conn_type": "google_cloud_platform", "extra": {"keyfile_dict": {"private_key": "pk"}, "project": "p"}}))
    for master, given in (("spark://m:7077", False), ("local[2]", True)):
        monkeypatch.setenv("AIRFLOW_CONN_SB_SPARK", json.dumps({"conn_type": "spark", "host": master}))
        hook = StreamBatchHook("sb_spark", storage_conn_id="sb_gcp")
        with hook.object_store_credentials():
            assert os.path.isfile(os.environ["GOOGLE_APPLICATION_CREDENTIALS"])
            conf = hook.conf
            assert conf["spark.executorEnv.GOOGLE_CLOUD_PROJECT"] == "p"
            assert ("spark.executorEnv.GOOGLE_APPLICATION_CREDENTIALS" in conf) is given


def test_a_spark_connections_storage_extra_applies_without_storage_conn_id(monkeypatch):
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    monkeypatch.setenv("AIRFLOW_CONN_SB_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]", "extra": {
        "storage": {"account_name": "acct", "sas_token": "sv=1&sig=abc"}}}))
    with StreamBatchHook("sb_spark").object_store_credentials() as variables:
        assert variables == {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_SAS_TOKEN": "sv=1&sig=abc"}
    with StreamBatchHook(None).object_store_credentials() as variables:
        assert variables == {}  # no connection: the processes' own environment


def test_storage_conn_id_is_a_keyword_argument_of_the_operator():
    from airflow_streambatch.operators.streambatch import StreamBatchOperator

    op = StreamBatchOperator(task_id="t", pipeline="m:f", output_path="/o", input_path="/i", storage_conn_id="s3")
    assert op.storage_conn_id == "s3" and op.hook.storage_conn_id == "s3"
    with pytest.raises(TypeError):
        StreamBatchOperator("m:f", "/o", task_id="t")  # every argument is keyword-only


def test_storage_conn_id_is_a_keyword_argument_of_the_sensor_and_its_trigger_gets_only_the_id():
    from airflow_streambatch.operators.streambatch import StreamBatchOperator
    from airflow_streambatch.sensors.epoch import EpochSensor
    from airflow_streambatch.triggers.epoch import EpochTrigger

    sensor = EpochSensor(task_id="w", input_path="s3://b/in", storage_conn_id="s3")
    assert sensor.storage_conn_id == "s3" and EpochSensor(task_id="v", input_path="/i").storage_conn_id is None
    # templated where the operator's is: neither, a connection id is not data
    assert ("storage_conn_id" in EpochSensor.template_fields) is ("storage_conn_id" in
                                                                  StreamBatchOperator.template_fields)
    trigger = EpochTrigger(input_path="s3://b/in", frontier="marker", interval_start="2026-11-22T10:00:00+00:00",
                           interval_end="2026-11-22T11:00:00+00:00", storage_conn_id="s3")
    _, kwargs = trigger.serialize()  # stored in Airflow's database: the connection's id, no credential
    assert kwargs["storage_conn_id"] == "s3" and EpochTrigger(**kwargs).serialize() == trigger.serialize()
