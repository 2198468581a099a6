"""Object-store credentials from an Airflow connection (issue 27, item 3): each supported connection
type becomes the environment variables the store's clients read (`hooks/object_store.py`).

`test_object_store_hook.py` tests how the hook applies them; `test_object_store_epochs.py` runs
epochs on the tests' S3 server with them.
"""

from __future__ import annotations

import json
import os
import stat

import pytest


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
