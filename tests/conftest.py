"""One real local SparkSession for the whole test session (it takes ~8 s to start)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import uuid

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Python workers (and Airflow's task processes) import user functions by module name,
# like any Spark job: make the test helper modules importable there and here.
_here = os.path.dirname(os.path.abspath(__file__))
_test_dirs = [os.path.join(_here, d) for d in ("", "engine", "provider", "compat")]
os.environ["PYTHONPATH"] = os.pathsep.join([*_test_dirs, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
sys.path[:0] = [d for d in [*_test_dirs, os.path.join(_here, "provider", "dags")] if d not in sys.path]

from ports import free_port, wait_for_port  # noqa: E402 - tests/ is importable from here on
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

# Airflow reads its home when first imported: give the test session its own (SQLite, no
# examples), never the developer's.
AIRFLOW_HOME = tempfile.mkdtemp(prefix="streambatch-airflow-home-")
os.environ["AIRFLOW_HOME"] = AIRFLOW_HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = os.path.join(_here, "provider", "dags")

SPARK_SLOTS = 4


# An S3-compatible server process (moto's), started on first use by `s3_server`. Its address and
# test credentials go into the environment now, before Spark starts, so that Spark's Python
# workers (which inherit the JVM's environment) reach it as the driver does; they also keep
# every client (pyarrow, obstore, boto3) off real AWS.
# A Spark Python worker that imports this module again (a test module it unpickles by reference imports
# it: test_default_parallelism's `from conftest import SPARK_SLOTS`) keeps the session's endpoint, which
# it inherited: a new port there sent every later S3 read of that reused worker to a closed port.
S3_ENDPOINT = os.environ.get("STREAMBATCH_TEST_S3_ENDPOINT") or f"http://127.0.0.1:{free_port()}"
os.environ["STREAMBATCH_TEST_S3_ENDPOINT"] = S3_ENDPOINT
os.environ.update(AWS_ENDPOINT_URL=S3_ENDPOINT, AWS_ACCESS_KEY_ID="streambatch-test",
                  AWS_SECRET_ACCESS_KEY="streambatch-test-secret", AWS_DEFAULT_REGION="us-east-1",
                  AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
for _name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
    os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """``python -m moto.server`` on 127.0.0.1: S3's HTTP protocol, conditional writes included."""
    port = int(S3_ENDPOINT.rsplit(":", 1)[1])
    log = open(tmp_path_factory.mktemp("s3") / "moto.log", "wb")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, server, "moto's S3 server")
    except TimeoutError as exc:
        server.kill()
        pytest.fail(f"{exc}; see {log.name}")
    yield S3_ENDPOINT
    server.terminate()
    server.wait(timeout=30)
    log.close()


@pytest.fixture()
def s3_bucket(s3_server):
    """A new, empty bucket on the S3 server: ``s3://<bucket>``."""
    import boto3

    name = f"sb-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server).create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture(scope="session")
def airflow_db():
    """A migrated SQLite metadata database in the session's AIRFLOW_HOME."""
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, capture_output=True, timeout=300)
    return AIRFLOW_HOME


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    from airflow_streambatch.engine.spark.session import with_spark_defaults

    session = (
        SparkSession.builder.master(f"local[{SPARK_SLOTS}]")
        .appName("airflow-streambatch-tests")
        .config(map=with_spark_defaults({"spark.ui.enabled": "false"}))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@dataclasses.dataclass(frozen=True)
class ConnectServer:
    url: str  # sc://127.0.0.1:<port>
    pid: int  # of spark-submit, the server's JVM


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory):
    """A Spark Connect server process (``local[SPARK_SLOTS]``, as `spark`) on 127.0.0.1.
    Its Python workers inherit this process's environment (PYTHONPATH, the S3 server's address)."""
    from airflow_streambatch.engine.spark.connect_server import start_connect_server, stop_connect_server

    port = free_port()
    log = open(tmp_path_factory.mktemp("connect") / "connect-server.log", "wb")
    try:
        server = start_connect_server(f"local[{SPARK_SLOTS}]", port, log, {"spark.ui.enabled": "false"})
    except TimeoutError as exc:
        pytest.fail(str(exc))
    yield ConnectServer(f"sc://127.0.0.1:{port}", server.pid)
    stop_connect_server(server)
    log.close()


@pytest.fixture()
def connect_session(connect_server):
    """A Spark Connect client session, the one the engine uses (`get_spark`) until the test ends."""
    from pyspark.sql.connect.session import SparkSession

    session = SparkSession.builder.remote(connect_server.url).create()
    yield session
    session.stop()


@pytest.fixture()
def spark_kind():
    """The kind of session `ctx` runs the engine on. Modules that run on both import
    `session_kinds.spark_kind`, which runs each of their tests on each kind."""
    return "classic"


@pytest.fixture()
def ctx(spark, tmp_path, spark_kind, request):
    """A fresh DataContext per test, with blocks under the test's tmp dir; on a Spark Connect
    session too where ``spark_kind`` says so."""
    from airflow_streambatch.engine import DataContext

    if spark_kind == "connect":
        request.getfixturevalue("connect_session")
    context = DataContext(block_dir=str(tmp_path / "blocks"), progress_interval_s=0, resources={"CPU": SPARK_SLOTS})
    with context.scoped():
        yield context
