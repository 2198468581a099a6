"""Object-store credentials from an Airflow connection, as the environment variables the clients read.

Why environment variables: every client that touches the store during an epoch reads
them without being told: pyarrow's S3, GCS and Azure filesystems (the engine's reads and
writes), obstore (commit records and write leases) and delta-rs (``write_delta``), in
the Spark driver and in Spark's Python workers alike. So a connection becomes one small
set of variables (`StoreEnvironment`), which `StreamBatchHook` sets in the driver's
process for the run only (`process_environment`) and gives Spark's executors as
``spark.executorEnv.<NAME>`` properties, which travel in its private properties file,
never on a command line. Every secret is registered with Airflow's secrets masker as soon
as the connection is read, before anything can log it.

Connections are read as the Airflow providers define them, without importing them
(none of those providers is a dependency):

* ``aws``: login = access key id, password = secret access key; extras
  ``aws_session_token``, ``endpoint_url`` (or ``service_config.s3.endpoint_url``),
  ``region_name``, ``profile_name``;
* ``google_cloud_platform``: extras ``keyfile_dict`` (written to a 0600 file in a private
  directory for the run), ``key_path`` or ``credential_config_file``, ``project``;
* ``wasb``, ``adls`` and ``azure_data_lake``: account name and key, SAS token,
  connection string, or a service principal (client id and secret with a tenant), in
  the fields and extras each of those connection types uses;
* ``spark`` / ``streambatch``: the extra ``storage``, a dict of the keys in
  `STORAGE_KEYS` (one Spark connection can then carry credentials for several stores).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from airflow.sdk import BaseHook
from airflow.sdk.log import mask_secret

AWS_TYPES = ("aws",)
GCP_TYPES = ("google_cloud_platform",)
AZURE_TYPES = ("wasb", "adls", "azure_data_lake")
SPARK_TYPES = ("spark", "streambatch")
SUPPORTED_TYPES = AWS_TYPES + GCP_TYPES + AZURE_TYPES + SPARK_TYPES

# The keys of a Spark connection's ``storage`` extra: the providers' own names for each setting.
AWS_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token", "endpoint_url", "region_name",
            "profile_name")
GCP_KEYS = ("keyfile_dict", "key_path", "credential_config_file", "project")
AZURE_KEYS = ("account_name", "account_key", "sas_token", "connection_string", "tenant_id", "client_id",
              "client_secret")
STORAGE_KEYS = AWS_KEYS + GCP_KEYS + AZURE_KEYS
SECRET_KEYS = ("aws_secret_access_key", "aws_session_token", "keyfile_dict", "account_key", "sas_token",
               "connection_string", "client_secret")

# An AWS connection can name ways to get credentials that need the Amazon provider's boto session (an STS
# call, a web identity): the environment cannot express them, so they are refused rather than ignored.
AWS_UNSUPPORTED = ("role_arn", "assume_role_method", "assume_role_kwargs", "session_kwargs", "aws_account_id")
GCP_UNSUPPORTED = ("key_secret_name", "impersonation_chain")


@dataclass(frozen=True)
class StoreEnvironment:
    """The environment a connection gives the processes that touch the store.

    ``variables``: name -> value; None removes an ambient variable that would contradict
    the connection (a session token left from other keys). ``secrets``: the values to mask.
    ``keyfile``: the text of a GCP key to write to a private file, whose path becomes
    ``GOOGLE_APPLICATION_CREDENTIALS`` (valid on this host only: see `host_local`).
    """

    conn_id: str
    variables: dict[str, str | None] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    keyfile: str | None = None

    @property
    def host_local(self) -> frozenset[str]:
        """Variables whose value means something on this host only (a file written here)."""
        return frozenset({"GOOGLE_APPLICATION_CREDENTIALS"} if self.keyfile is not None else ())

    def mask(self) -> None:
        """Register every secret with Airflow's secrets masker (task logs, rendered fields)."""
        for secret in self.secrets:
            mask_secret(secret)


def store_environment(conn_id: str, conn_type: str | None, *, login: str | None = None,
                      password: str | None = None, host: str | None = None,
                      extra: Mapping | None = None) -> StoreEnvironment:
    """The environment for a connection's fields (`ObjectStoreHook` reads them from Airflow)."""
    extra = dict(extra or {})
    where = f"connection {conn_id!r} (type {conn_type!r})"
    if conn_type in AWS_TYPES:
        settings = {**_extras(extra, conn_type, AWS_KEYS), **_present(aws_access_key_id=login,
                                                                      aws_secret_access_key=password)}
        s3 = ((extra.get("service_config") or {}).get("s3") or {}).get("endpoint_url")
        if s3:
            settings["endpoint_url"] = s3
        _refuse(extra, AWS_UNSUPPORTED, where, "assuming a role needs the Amazon provider's session: give the "
                "connection the role's keys, or run the workers under the role")
        return _environment(conn_id, _aws(settings, where))
    if conn_type in GCP_TYPES:
        _refuse({k.removeprefix(f"extra__{conn_type}__"): v for k, v in extra.items()}, GCP_UNSUPPORTED, where,
                "give the key itself (keyfile_dict) or a file the workers can read (key_path)")
        return _environment(conn_id, _gcp(_extras(extra, conn_type, GCP_KEYS), where))
    if conn_type in AZURE_TYPES:
        return _environment(conn_id, _azure(_azure_settings(conn_type, login, password, host, extra), where))
    if conn_type in SPARK_TYPES:
        storage = extra.get("storage")
        if not isinstance(storage, Mapping) or not storage:
            raise ValueError(f"{where} has no 'storage' extra: give it a dict of object-store credentials with "
                             f"keys among {', '.join(STORAGE_KEYS)}, or use an aws, google_cloud_platform or "
                             "wasb connection")
        unknown = sorted(set(storage) - set(STORAGE_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} in its 'storage' extra; the keys are "
                             f"{', '.join(STORAGE_KEYS)}")
        settings = {k: v for k, v in storage.items() if v not in (None, "")}
        parts = [_aws({k: settings[k] for k in AWS_KEYS if k in settings}, where),
                 _gcp({k: settings[k] for k in GCP_KEYS if k in settings}, where),
                 _azure({k: settings[k] for k in AZURE_KEYS if k in settings}, where)]
        return _environment(conn_id, *parts)
    raise ValueError(f"storage_conn_id={conn_id!r}: connection type {conn_type!r} does not hold object-store "
                     f"credentials here; the supported types are {', '.join(SUPPORTED_TYPES)}")


# -- per store: settings (the providers' key names) -> variables, secrets, key file ----------
_Part = tuple[dict[str, str | None], list[str], str | None]


def _aws(s: dict, where: str) -> _Part:
    variables: dict[str, str | None] = {}
    key_id, secret = s.get("aws_access_key_id"), s.get("aws_secret_access_key")
    if bool(key_id) != bool(secret):
        raise ValueError(f"{where}: give both the access key id (login) and the secret access key (password), "
                         "or neither to use the workers' own AWS credentials")
    if key_id:
        # a token of other keys would make every request fail: the connection's keys go without one
        variables.update(AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret,
                         AWS_SESSION_TOKEN=s.get("aws_session_token") or None)
    elif s.get("aws_session_token"):
        raise ValueError(f"{where}: aws_session_token needs the access key id and secret access key it belongs to")
    if s.get("endpoint_url"):  # S3's own variable wins over the general one in the SDKs: set both
        variables.update(AWS_ENDPOINT_URL=s["endpoint_url"], AWS_ENDPOINT_URL_S3=s["endpoint_url"])
    if s.get("region_name"):
        variables.update(AWS_REGION=s["region_name"], AWS_DEFAULT_REGION=s["region_name"])
    if s.get("profile_name"):
        variables["AWS_PROFILE"] = s["profile_name"]
    # the key id too: Spark's UI redacts access keys (`SENSITIVE`), so the logs mask it as well
    return variables, [s[k] for k in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
                       if s.get(k)], None


def _gcp(s: dict, where: str) -> _Part:
    given = [k for k in ("keyfile_dict", "key_path", "credential_config_file") if s.get(k)]
    if len(given) > 1:
        raise ValueError(f"{where}: {' and '.join(given)} are exclusive: give one")
    variables: dict[str, str | None] = {}
    secrets: list[str] = []
    keyfile = None
    if given:
        kind, source = given[0], s[given[0]]
        if kind == "key_path" or (kind == "credential_config_file" and isinstance(source, str)
                                  and not source.lstrip().startswith("{")):
            variables["GOOGLE_APPLICATION_CREDENTIALS"] = source  # a file the user manages
        else:  # the key itself (or a workload identity config): written to a private file for the run
            try:
                key = json.loads(source) if isinstance(source, str) else dict(source)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: {kind} is not a JSON object (a service account key)") from exc
            keyfile = json.dumps(key)
            secrets += [keyfile, *(v for v in (key.get("private_key"), source) if isinstance(v, str) and v)]
    if s.get("project"):
        variables["GOOGLE_CLOUD_PROJECT"] = s["project"]
    return variables, secrets, keyfile


def _azure(s: dict, where: str) -> _Part:
    s = dict(s)
    if s.get("connection_string"):  # AccountName=...;AccountKey=...;SharedAccessSignature=...
        fields = dict(p.split("=", 1) for p in s["connection_string"].split(";") if "=" in p)
        s.setdefault("account_name", fields.get("AccountName"))
        s.setdefault("account_key", fields.get("AccountKey"))
        s.setdefault("sas_token", fields.get("SharedAccessSignature"))
    sas = s.get("sas_token")
    if sas and sas.startswith("https://"):  # a SAS URL: the account is its host, the token its query
        url = urlsplit(sas)
        s.setdefault("account_name", url.hostname.split(".")[0] if url.hostname else None)
        sas = url.query
    variables: dict[str, str | None] = {}
    for name, key in (("AZURE_STORAGE_ACCOUNT_NAME", "account_name"), ("AZURE_STORAGE_ACCOUNT_KEY", "account_key"),
                      ("AZURE_CLIENT_ID", "client_id"), ("AZURE_CLIENT_SECRET", "client_secret"),
                      ("AZURE_TENANT_ID", "tenant_id")):
        if s.get(key):
            variables[name] = s[key]
    if sas:
        variables["AZURE_STORAGE_SAS_TOKEN"] = sas.lstrip("?")
    if bool(s.get("client_id")) != bool(s.get("client_secret")) or (s.get("client_id") and not s.get("tenant_id")):
        raise ValueError(f"{where}: a service principal needs its client id, client secret and tenant id together")
    secrets = [v for v in (s.get("account_key"), sas and sas.lstrip("?"), s.get("client_secret"),
                           s.get("connection_string")) if v]
    return variables, secrets, None


def _azure_settings(conn_type: str, login, password, host, extra: dict) -> dict:
    """An Azure connection's fields as `AZURE_KEYS`, the way each of the three connection types reads them."""
    s = _extras(extra, conn_type, ("account_name", "account_key", "shared_access_key", "sas_token",
                                   "connection_string", "tenant_id", "tenant"))
    tenant = s.pop("tenant_id", None) or s.pop("tenant", None)
    s["account_key"] = s.get("account_key") or s.pop("shared_access_key", None)
    account = _account_name(host)
    if conn_type == "azure_data_lake":  # Gen1: login/password are a service principal, the store an extra
        principal = True
    elif conn_type == "adls":  # Gen2: host is the account; with a tenant, login/password are a service principal
        principal = bool(tenant)
    else:  # wasb: with a tenant, a service principal (account in host); else login is the account, password its key
        principal = bool(tenant)
        if not principal:
            account = account or login
    if principal and (login or password):
        s.update(client_id=login, client_secret=password, tenant_id=tenant)
    elif password and not s.get("account_key"):
        s["account_key"] = password
    if account and not s.get("account_name"):
        s["account_name"] = account
    return {k: v for k, v in s.items() if v not in (None, "")}


def _account_name(host: str | None) -> str | None:
    """``myaccount`` from ``https://myaccount.blob.core.windows.net/`` or a bare ``myaccount``."""
    if not host:
        return None
    name = urlsplit(host).hostname if "://" in host else host
    return name.split(".")[0] if name else None


def _extras(extra: dict, conn_type: str, keys: tuple[str, ...]) -> dict:
    """The given keys of an extra, also in the old ``extra__<type>__<key>`` spelling of the connection forms."""
    found = {}
    for key in keys:
        value = extra.get(key, extra.get(f"extra__{conn_type}__{key}"))
        if value not in (None, ""):
            found[key] = value
    return found


def _present(**values) -> dict:
    return {k: v for k, v in values.items() if v}


def _refuse(extra: dict, keys: tuple[str, ...], where: str, advice: str) -> None:
    given = [k for k in keys if extra.get(k)]
    if given:
        raise ValueError(f"{where}: {', '.join(given)} cannot be passed to Spark as environment variables; {advice}")


def _environment(conn_id: str, *parts: _Part) -> StoreEnvironment:
    variables: dict[str, str | None] = {}
    secrets: list[str] = []
    keyfiles = []
    for part_variables, part_secrets, keyfile in parts:
        variables.update(part_variables)
        secrets += part_secrets
        if keyfile is not None:
            keyfiles.append(keyfile)
    if not variables and not keyfiles:
        raise ValueError(f"connection {conn_id!r} holds no object-store credentials (login/password, or the extras "
                         "of its type): nothing to pass to the store's clients")
    return StoreEnvironment(conn_id, {k: str(v) if v is not None else None for k, v in variables.items()},
                            tuple(dict.fromkeys(str(s) for s in secrets)), keyfiles[0] if keyfiles else None)


# -- applying it ---------------------------------------------------------------------------
@contextlib.contextmanager
def process_environment(variables: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or, for None, remove) ``variables`` in ``os.environ``; on exit put back what was there."""
    previous = {name: os.environ.get(name) for name in variables}
    try:
        _set_environment(variables)
        yield
    finally:
        _set_environment(previous)


def _set_environment(variables: Mapping[str, str | None]) -> None:
    for name, value in variables.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextlib.contextmanager
def applied(store: StoreEnvironment) -> Iterator[dict[str, str | None]]:
    """``store`` in this process for the block: secrets masked, a GCP key written, ``os.environ`` set.

    Yields the variables as set (the key file's path included). The key file lives in a
    0700 directory, is 0600, and is deleted on exit with the variables restored.
    """
    store.mask()
    private = None
    variables = dict(store.variables)
    try:
        if store.keyfile is not None:
            private = tempfile.mkdtemp(prefix="streambatch-gcp-")  # 0700
            path = os.path.join(private, "credentials.json")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(store.keyfile)
            variables["GOOGLE_APPLICATION_CREDENTIALS"] = path
        with process_environment(variables):
            yield variables
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


class ObjectStoreHook(BaseHook):
    """Reads an Airflow connection's object-store credentials (`store_environment`) and masks their secrets.

    :param storage_conn_id: a connection of a type in `SUPPORTED_TYPES`.
    """

    conn_name_attr = "storage_conn_id"
    hook_name = "Object-store credentials for streaming batch"

    def __init__(self, storage_conn_id: str) -> None:
        super().__init__()
        self.storage_conn_id = storage_conn_id

    def store_environment(self) -> StoreEnvironment:
        return self._environment_of(self.get_connection(self.storage_conn_id))

    async def astore_environment(self) -> StoreEnvironment:
        """`store_environment` for a trigger: the connection read without blocking the triggerer's event loop."""
        return self._environment_of(await self.aget_connection(self.storage_conn_id))

    def _environment_of(self, conn) -> StoreEnvironment:
        store = store_environment(self.storage_conn_id, conn.conn_type, login=conn.login, password=conn.password,
                                  host=conn.host, extra=conn.extra_dejson)
        store.mask()  # before anything logs, whatever the caller does next
        return store


@contextlib.contextmanager
def connection_credentials(storage_conn_id: str | None, log=None) -> Iterator[dict[str, str | None]]:
    """``storage_conn_id``'s credentials in this process for the block (`applied`); none given: nothing changes.

    For a task that touches the store from its own process only (`EpochSensor`'s listings
    and manifest); ``log`` gets one line naming the variables set, never their values.
    """
    if storage_conn_id is None:
        yield {}
        return
    store = ObjectStoreHook(storage_conn_id).store_environment()
    with applied(store) as variables:
        if log is not None:
            log.info("Object-store credentials from connection %s: %s", store.conn_id,
                     ", ".join(sorted(k for k, v in variables.items() if v is not None)))
        yield variables
