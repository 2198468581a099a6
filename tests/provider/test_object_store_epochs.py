"""Real epochs under ``dag.test()`` read and write the tests' S3 server (moto's) with the keys of an
``aws`` connection given as ``storage_conn_id`` (issue 27, item 3): the operator's, in process and
through spark-submit, and the sensor's, poking and deferred.

During those runs the server enforces authentication (moto's ``/moto-api/reset-auth``): it
accepts only the keys of an IAM user the test creates, so the ambient keys of the test session
(``AWS_ACCESS_KEY_ID=streambatch-test``, `tests/conftest.py`) are refused and only the
connection's keys can have done the work. A pipeline (`pipelines.record_environment`) records
what the Spark driver and its Python workers saw in their environment; a watcher reads every
process's command line, as ``ps`` would, for the secret.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid

import pendulum
import pytest
from argv_watcher import ArgvWatcher
from pipelines import environment_reports, write_inputs

LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")


@pytest.fixture()
def s3_with_auth(s3_server, monkeypatch, tmp_path):
    """A bucket on the tests' S3 server holding one epoch's inputs, an ``aws`` connection ``sb_s3`` with
    the keys of an IAM user, and a server that, until the test ends, refuses every request not signed
    with an IAM user's keys: the session's ambient ``streambatch-test`` keys are wrong from then on."""
    import boto3
    import requests

    iam = boto3.client("iam", endpoint_url=s3_server)  # moto accepts anything until auth is on
    user = f"sb-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    iam.put_user_policy(UserName=user, PolicyName="s3", PolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName=user)["AccessKey"]
    bucket = f"sb-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3", endpoint_url=s3_server, aws_access_key_id=key["AccessKeyId"],
                      aws_secret_access_key=key["SecretAccessKey"])
    s3.create_bucket(Bucket=bucket)
    write_inputs(tmp_path / "in", partitions=3)
    for name in sorted(os.listdir(tmp_path / "in")):
        s3.upload_file(str(tmp_path / "in" / name), bucket, f"in/2026-11-22/{name}")
    monkeypatch.setenv("AIRFLOW_CONN_SB_S3", json.dumps({
        "conn_type": "aws", "login": key["AccessKeyId"], "password": key["SecretAccessKey"],
        "extra": {"endpoint_url": s3_server, "region_name": "us-east-1"}}))
    previous = requests.post(f"{s3_server}/moto-api/reset-auth", data=b"0", timeout=30).json()
    try:
        yield {"bucket": bucket, "s3": s3, "key_id": key["AccessKeyId"], "secret": key["SecretAccessKey"],
               "endpoint": s3_server}
    finally:
        requests.post(f"{s3_server}/moto-api/reset-auth",
                      data=previous["PREVIOUS_INITIAL_NO_AUTH_ACTION_COUNT"].encode(), timeout=30)


def _ambient_keys_are_refused(bucket: str) -> None:
    import pyarrow.fs as pafs

    assert os.environ["AWS_ACCESS_KEY_ID"] == "streambatch-test"
    with pytest.raises(OSError, match="(?i)access ?key|forbidden|denied"):
        pafs.FileSystem.from_uri(f"s3://{bucket}")[0].get_file_info(pafs.FileSelector(f"{bucket}/in", recursive=True))


def _keys(store: dict, prefix: str) -> list[str]:
    listing = store["s3"].list_objects_v2(Bucket=store["bucket"], Prefix=prefix)
    return [obj["Key"] for obj in listing.get("Contents", [])]


def _xcom(dag_id: str, task_id: str):
    from airflow import settings
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    with settings.Session() as session:
        row = session.scalars(select(XComModel).where(XComModel.dag_id == dag_id, XComModel.task_id == task_id,
                                                      XComModel.key == "return_value")).one()
        return XComModel.deserialize_value(row)


def _output_ids(store: dict) -> list[int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = []
    for key in _keys(store, "out/2026-11-22/p"):
        if key.endswith(".parquet"):
            body = store["s3"].get_object(Bucket=store["bucket"], Key=key)["Body"].read()
            ids += pq.read_table(pa.BufferReader(body))["id"].to_pylist()
    return sorted(ids)


def _run_watched(dag, store, root):
    with ArgvWatcher((store["secret"].encode(),)) as watcher:
        dr = dag.test(logical_date=LOGICAL, run_after=LOGICAL,
                      run_conf={"store": f"s3://{store['bucket']}", "root": str(root)})
    return {ti.task_id: ti.state for ti in dr.get_task_instances()}, watcher


def _assert_every_process_used_the_connection(store, reports: list[dict], driver_in_this_process: bool):
    """The Spark driver (this process, or spark-submit's) and every Python worker held the connection's keys."""
    secret_sha = hashlib.sha256(store["secret"].encode()).hexdigest()
    drivers = {r["pid"] for r in reports if r["where"] == "driver"}
    workers = {r["pid"] for r in reports if r["where"] == "worker"}
    assert len(drivers) == 1 and workers and os.getpid() not in workers  # Spark's Python workers, elsewhere
    assert (drivers == {os.getpid()}) is driver_in_this_process
    assert all(r["key_id"] == store["key_id"] and r["secret_sha256"] == secret_sha for r in reports), reports


def test_an_in_process_epoch_reads_and_writes_s3_with_the_connections_keys(ctx, spark, airflow_db, s3_with_auth,
                                                                          tmp_path, caplog, capfd):
    """Embedded Spark already running in the process (as in a notebook): the driver's environment for the
    run, the Python workers' through the SparkContext's environment; both put back afterwards."""
    from airflow.sdk._shared.secrets_masker import redact
    from streambatch_test_dags import sb_store_in_process

    store = s3_with_auth
    _ambient_keys_are_refused(store["bucket"])
    workers_env = dict(spark.sparkContext.environment)
    with caplog.at_level(logging.INFO):
        states, watcher = _run_watched(sb_store_in_process, store, tmp_path)
    assert states == {"score": "success"}, capfd.readouterr().out[-4000:]
    assert _output_ids(store) == list(range(300))
    _assert_every_process_used_the_connection(store, environment_reports(tmp_path / "env"),
                                              driver_in_this_process=True)

    logged = caplog.text + "".join(capfd.readouterr())
    assert "Object-store credentials from connection sb_s3: AWS_ACCESS_KEY_ID, AWS_DEFAULT_REGION" in logged
    assert store["secret"] not in logged and store["secret"] not in redact(f"key={store['secret']}")
    assert not watcher.leaked
    # the run's environment is gone: this process's and the workers' are what they were
    assert os.environ["AWS_ACCESS_KEY_ID"] == "streambatch-test" and "AWS_SESSION_TOKEN" not in os.environ
    assert dict(spark.sparkContext.environment) == workers_env
    _ambient_keys_are_refused(store["bucket"])


def test_a_spark_submit_epoch_gets_the_keys_through_its_environment_and_properties_file(ctx, airflow_db, s3_with_auth,
                                                                                        tmp_path, monkeypatch, capfd):
    """spark-submit (a JVM and a Python driver of its own): its driver inherits the run's environment,
    its executors get ``spark.executorEnv.*`` from the 0600 properties file, never from a command line."""
    from streambatch_test_dags import sb_store_spark_submit

    store = s3_with_auth
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", '{"conn_type": "spark", "host": "local[2]"}')
    states, watcher = _run_watched(sb_store_spark_submit, store, tmp_path)
    assert states == {"score": "success"}, capfd.readouterr().out[-4000:]
    assert _output_ids(store) == list(range(300))
    _assert_every_process_used_the_connection(store, environment_reports(tmp_path / "env"),
                                              driver_in_this_process=False)
    assert watcher.spark_submit_jvms and not watcher.leaked
    text = watcher.private_properties_text()
    assert f"spark.executorEnv.AWS_ACCESS_KEY_ID={store['key_id']}" in text
    assert "spark.executorEnv.AWS_SECRET_ACCESS_KEY=" in text
    assert store["secret"] not in "".join(capfd.readouterr())
    assert os.environ["AWS_ACCESS_KEY_ID"] == "streambatch-test"


@pytest.mark.parametrize("dag_id", ["sb_store_sensed", "sb_store_sensed_deferrable"])
def test_the_sensor_lists_and_freezes_s3_input_with_the_connections_keys(ctx, airflow_db, s3_with_auth, tmp_path,
                                                                          monkeypatch, caplog, capfd, dag_id):
    """``EpochSensor(storage_conn_id=...)`` reads the marker, lists the input and writes the manifest on the
    S3 server with the connection's keys: poking in the task, or deferred, in the trigger (which reads the
    connection in the triggerer). The marker appears just after the sensor's first look, so the epoch
    passes its frontier in the second poke, or in the trigger. Before, the sensor had no such argument
    and listed with the ambient keys, which this server refuses; the operator then reads the frozen
    manifest with its own ``storage_conn_id``."""
    import streambatch_test_dags

    from airflow_streambatch.sensors import epoch as sensor_module

    store = s3_with_auth
    first_look = sensor_module.check_epoch

    def look_then_mark(*args):
        found = first_look(*args)
        store["s3"].put_object(Bucket=store["bucket"], Key="in/2026-11-22/_SUCCESS", Body=b"")
        return found

    monkeypatch.setattr(sensor_module, "check_epoch", look_then_mark)
    _ambient_keys_are_refused(store["bucket"])
    with caplog.at_level(logging.INFO):
        states, watcher = _run_watched(getattr(streambatch_test_dags, dag_id), store, tmp_path)
    assert states == {"wait_for_epoch": "success", "score": "success"}, capfd.readouterr().out[-4000:]
    # never under the input: poking, the sensor has no location (XCom carries the small manifest whole);
    # deferred, it is told the output and the trigger writes the manifest beside it
    assert [key for key in _keys(store, "in/") if "_manifests" in key] == []
    manifests = [key for key in _keys(store, "out/2026-11-22/_manifests/") if key.endswith(".json")]
    assert len(manifests) == dag_id.endswith("_deferrable")
    pointer = _xcom(dag_id, "wait_for_epoch")
    assert (pointer.get("manifest_uri") == f"s3://{store['bucket']}/{manifests[0]}" if manifests
            else len(pointer["partitions"]) == 3)
    assert _output_ids(store) == list(range(300))

    logged = caplog.text + "".join(capfd.readouterr())
    assert ("[DAG TEST] running trigger in line" in logged) is dag_id.endswith("_deferrable")
    assert "frontier not passed yet" in logged or dag_id.endswith("_deferrable")  # a second poke passed it
    assert logged.count("Object-store credentials from connection sb_s3: AWS_ACCESS_KEY_ID") >= 2  # sensor, operator
    assert store["secret"] not in logged and not watcher.leaked
    assert os.environ["AWS_ACCESS_KEY_ID"] == "streambatch-test" and "AWS_SESSION_TOKEN" not in os.environ
    _ambient_keys_are_refused(store["bucket"])
