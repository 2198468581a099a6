"""Object-store credentials come from an Airflow connection (issue 27, item 3).

The connection -> environment mapping of every supported type, then real epochs under
``dag.test()`` that read and write the tests' S3 server (moto's) with the keys of an
``aws`` connection given as ``storage_conn_id``. During those runs the server enforces
authentication (moto's ``/moto-api/reset-auth``): it accepts only the keys of an IAM user
the test creates, so the ambient keys of the test session (``AWS_ACCESS_KEY_ID=streambatch-test``,
`tests/conftest.py`) are refused and only the connection's keys can have done the work.
A pipeline records what the Spark driver and its Python workers saw in their environment;
a watcher reads every process's command line, as ``ps`` would, for the secret.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import threading
import time
import uuid
from functools import partial

import pendulum
import pyarrow.compute as pc
import pytest
from pipelines import write_inputs

LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")


# -- the mapping, per connection type -----------------------------------------------------
def _env(conn_type, **fields):
    from airflow_streambatch.hooks.object_store import store_environment

    return store_environment("sb_store", conn_type, **fields)


def test_an_aws_connection_gives_keys_token_endpoint_and_region():
    store = _env("aws", login="AKIAEXAMPLE", password="s3cr3t/Key+", extra={
        "aws_session_token": "tok3n", "endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"})
    assert store.variables == {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t/Key+", "AWS_SESSION_TOKEN": "tok3n",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9000",
        "AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "eu-west-1"}
    assert {"s3cr3t/Key+", "tok3n"} <= set(store.secrets) and store.keyfile is None
    # keys without a token remove an ambient one (it would belong to other keys); S3's own endpoint wins
    store = _env("aws", extra={"aws_access_key_id": "AK", "aws_secret_access_key": "SK",
                               "service_config": {"s3": {"endpoint_url": "https://s3.internal"}}})
    assert store.variables["AWS_SESSION_TOKEN"] is None
    assert store.variables["AWS_ENDPOINT_URL_S3"] == store.variables["AWS_ENDPOINT_URL"] == "https://s3.internal"
    # no keys: only where and which region; the workers' own credentials (an instance role) apply
    assert _env("aws", extra={"region_name": "us-west-2"}).variables == {"AWS_REGION": "us-west-2",
                                                                          "AWS_DEFAULT_REGION": "us-west-2"}
    assert _env("aws", extra={"profile_name": "batch"}).variables == {"AWS_PROFILE": "batch"}


@pytest.mark.parametrize(("fields", "message"), [
    ({"login": "AK"}, "give both the access key id"),
    ({"extra": {"role_arn": "arn:aws:iam::1:role/r"}}, "role_arn cannot be passed to Spark"),
    ({"extra": {"aws_session_token": "t"}}, "aws_session_token needs the access key id"),
    ({}, "holds no object-store credentials"),
])
def test_an_aws_connection_that_cannot_become_an_environment_is_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        _env("aws", **fields)


def test_a_gcp_connection_gives_a_key_file_path_or_the_users_own():
    key = {"type": "service_account", "client_email": "sa@p.iam.gserviceaccount.com",
           "private_key": "-----BEGIN PRIVATE KEY-----\nMIIEv\n-----END PRIVATE KEY-----\n"}
    store = _env("google_cloud_platform", extra={"keyfile_dict": json.dumps(key), "project": "proj"})
    assert json.loads(store.keyfile) == key and store.variables == {"GOOGLE_CLOUD_PROJECT": "proj"}
    assert key["private_key"] in store.secrets and store.host_local == {"GOOGLE_APPLICATION_CREDENTIALS"}
    # the old form's prefixed extras, and a dict as well as its JSON text
    store = _env("google_cloud_platform", extra={"extra__google_cloud_platform__keyfile_dict": key})
    assert json.loads(store.keyfile) == key
    store = _env("google_cloud_platform", extra={"key_path": "/secrets/gcp.json"})
    assert store.variables == {"GOOGLE_APPLICATION_CREDENTIALS": "/secrets/gcp.json"} and store.keyfile is None
    assert not store.host_local  # the user's file: executors are given its path
    with pytest.raises(ValueError, match="keyfile_dict and key_path are exclusive"):
        _env("google_cloud_platform", extra={"keyfile_dict": key, "key_path": "/k.json"})
    with pytest.raises(ValueError, match="key_secret_name cannot be passed"):
        _env("google_cloud_platform", extra={"key_secret_name": "projects/p/secrets/k"})


def test_a_gcp_key_file_is_private_for_the_run_and_gone_after(monkeypatch):
    from airflow_streambatch.hooks.object_store import applied

    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/ambient/key.json")
    store = _env("google_cloud_platform", extra={"keyfile_dict": {"type": "service_account", "private_key": "pk"}})
    with applied(store) as variables:
        path = os.environ["GOOGLE_APPLICATION_CREDENTIALS"]
        assert variables["GOOGLE_APPLICATION_CREDENTIALS"] == path != "/ambient/key.json"
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
        assert json.loads(open(path).read())["private_key"] == "pk"
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path))
    assert os.environ["GOOGLE_APPLICATION_CREDENTIALS"] == "/ambient/key.json"


@pytest.mark.parametrize(("conn_type", "fields", "variables"), [
    ("wasb", {"login": "acct", "password": "S2V5=="},  # login is the account, password its key
     {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "S2V5=="}),
    ("wasb", {"login": "acct", "extra": {"sas_token": "?sv=2024&sig=abc%3D"}},
     {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_SAS_TOKEN": "sv=2024&sig=abc%3D"}),
    ("wasb", {"extra": {"sas_token": "https://acct.blob.core.windows.net/c?sv=1&sig=x"}},
     {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_SAS_TOKEN": "sv=1&sig=x"}),
    ("wasb", {"login": "acct", "extra": {"shared_access_key": "S2V5=="}},
     {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "S2V5=="}),
    ("wasb", {"extra": {"connection_string": "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=S2V5==;"
                                             "EndpointSuffix=core.windows.net"}},
     {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "S2V5=="}),
    ("wasb", {"login": "app-id", "password": "app-secret", "host": "https://acct.blob.core.windows.net/",
              "extra": {"tenant_id": "tenant"}},  # a service principal; the account is the host's
     {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_CLIENT_ID": "app-id", "AZURE_CLIENT_SECRET": "app-secret",
      "AZURE_TENANT_ID": "tenant"}),
    ("adls", {"host": "acct", "password": "S2V5=="},
     {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "S2V5=="}),
    ("adls", {"host": "acct", "login": "app-id", "password": "app-secret", "extra": {"tenant_id": "tenant"}},
     {"AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_CLIENT_ID": "app-id", "AZURE_CLIENT_SECRET": "app-secret",
      "AZURE_TENANT_ID": "tenant"}),
    ("azure_data_lake", {"login": "app-id", "password": "app-secret",
                         "extra": {"tenant": "tenant", "account_name": "store"}},
     {"AZURE_STORAGE_ACCOUNT_NAME": "store", "AZURE_CLIENT_ID": "app-id", "AZURE_CLIENT_SECRET": "app-secret",
      "AZURE_TENANT_ID": "tenant"}),
])
def test_azure_connections_give_the_account_and_its_key_token_or_service_principal(conn_type, fields, variables):
    store = _env(conn_type, **fields)
    assert store.variables == variables
    secret_names = {"AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET"}
    assert {v for k, v in variables.items() if k in secret_names} <= set(store.secrets)


def test_a_spark_connections_storage_extra_can_hold_several_stores():
    store = _env("spark", host="spark://m:7077", extra={"conf": {}, "storage": {
        "aws_access_key_id": "AK", "aws_secret_access_key": "SK", "endpoint_url": "http://minio:9000",
        "account_name": "acct", "account_key": "S2V5==", "key_path": "/secrets/gcp.json"}})
    assert store.variables == {
        "AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK", "AWS_SESSION_TOKEN": None,
        "AWS_ENDPOINT_URL": "http://minio:9000", "AWS_ENDPOINT_URL_S3": "http://minio:9000",
        "GOOGLE_APPLICATION_CREDENTIALS": "/secrets/gcp.json",
        "AZURE_STORAGE_ACCOUNT_NAME": "acct", "AZURE_STORAGE_ACCOUNT_KEY": "S2V5=="}
    with pytest.raises(ValueError, match="unknown key.*aws_secret_key.*the keys are aws_access_key_id"):
        _env("streambatch", extra={"storage": {"aws_secret_key": "x"}})
    with pytest.raises(ValueError, match="has no 'storage' extra"):
        _env("spark", extra={"conf": {}})


def test_an_unsupported_connection_type_names_the_supported_ones():
    with pytest.raises(ValueError, match=r"storage_conn_id='sb_store': connection type 'postgres' .* supported types "
                                         r"are aws, google_cloud_platform, wasb, adls, azure_data_lake, spark, "
                                         r"streambatch"):
        _env("postgres", login="u", password="p")


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                  "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_CONNECTION_STRING"])
def test_the_spark_ui_redacts_the_executor_environment_of_every_secret(name):
    from airflow_streambatch.hooks.streambatch import _SENSITIVE

    assert _SENSITIVE.search(f"spark.executorEnv.{name}")
    assert _SENSITIVE.search(f"spark.yarn.appMasterEnv.{name}")


@pytest.mark.parametrize("name", ["AWS_ENDPOINT_URL", "AWS_REGION", "AZURE_STORAGE_ACCOUNT_NAME",
                                  "GOOGLE_CLOUD_PROJECT", "PYSPARK_PYTHON"])
def test_the_spark_ui_still_shows_what_is_not_secret(name):
    from airflow_streambatch.hooks.streambatch import _SENSITIVE

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


# -- real epochs on the S3 server, which accepts only the connection's keys ----------------------
def record_environment(ds, epoch, *, report_dir: str):
    """A pipeline that records what the driver and each Python worker see of the AWS environment."""
    os.makedirs(report_dir, exist_ok=True)
    _report(report_dir, "driver")
    return ds.map_batches(partial(_score_and_report, report_dir=report_dir), batch_format="pyarrow")


def _score_and_report(batch, report_dir: str):
    _report(report_dir, "worker")
    return batch.append_column("score", pc.multiply(batch["id"], 2))


def _report(report_dir: str, where: str) -> None:
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    entry = {"where": where, "pid": os.getpid(), "key_id": os.environ.get("AWS_ACCESS_KEY_ID"),
             "secret_sha256": hashlib.sha256(secret.encode()).hexdigest()}
    with open(os.path.join(report_dir, f"{where}-{os.getpid()}-{uuid.uuid4().hex}.json"), "w") as f:
        json.dump(entry, f)


def _reports(report_dir) -> list[dict]:
    return [json.loads((report_dir / name).read_text()) for name in sorted(os.listdir(report_dir))]


class _Watcher(threading.Thread):
    """Reads every process's command line while a run goes on, as ``ps`` would, and keeps those
    holding ``needle``; notes the Spark JVMs and their properties files (path -> mode, text)."""

    def __init__(self, needle: bytes):
        super().__init__(daemon=True)
        self.needle = needle
        self.leaked: list[bytes] = []
        self.spark_jvms = 0
        self.properties: dict[str, tuple[int, str]] = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = f.read()
                except OSError:
                    continue
                if self.needle in argv:
                    self.leaked.append(argv)
                args = argv.split(b"\0")
                if b"org.apache.spark.deploy.SparkSubmit" in argv:
                    self.spark_jvms += 1
                if b"--properties-file" in args:
                    path = args[args.index(b"--properties-file") + 1].decode()
                    try:
                        with open(path, encoding="utf-8") as f:
                            self.properties[path] = (stat.S_IMODE(os.stat(path).st_mode), f.read())
                    except OSError:
                        pass
            time.sleep(0.02)


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


def _output_ids(store: dict) -> list[int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    listed = store["s3"].list_objects_v2(Bucket=store["bucket"], Prefix="out/2026-11-22/p")["Contents"]
    ids = []
    for obj in listed:
        if obj["Key"].endswith(".parquet"):
            body = store["s3"].get_object(Bucket=store["bucket"], Key=obj["Key"])["Body"].read()
            ids += pq.read_table(pa.BufferReader(body))["id"].to_pylist()
    return sorted(ids)


def _run_watched(dag, store, root):
    watcher = _Watcher(store["secret"].encode())
    watcher.start()
    try:
        dr = dag.test(logical_date=LOGICAL, run_after=LOGICAL,
                      run_conf={"store": f"s3://{store['bucket']}", "root": str(root)})
    finally:
        watcher.stop.set()
        watcher.join()
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
    _assert_every_process_used_the_connection(store, _reports(tmp_path / "env"), driver_in_this_process=True)

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
    _assert_every_process_used_the_connection(store, _reports(tmp_path / "env"), driver_in_this_process=False)
    assert watcher.spark_jvms and not watcher.leaked
    assert watcher.properties and {mode for mode, _ in watcher.properties.values()} == {0o600}
    text = "".join(t for _, t in watcher.properties.values())
    assert f"spark.executorEnv.AWS_ACCESS_KEY_ID={store['key_id']}" in text
    assert "spark.executorEnv.AWS_SECRET_ACCESS_KEY=" in text
    assert not any(os.path.exists(path) for path in watcher.properties)
    assert store["secret"] not in "".join(capfd.readouterr())
    assert os.environ["AWS_ACCESS_KEY_ID"] == "streambatch-test"
