"""One real local SparkSession for the whole test session (it takes ~8 s to start)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Python workers (and Airflow's task processes) import user functions by module name,
# like any Spark job: make the test helper modules importable there and here.
_here = os.path.dirname(os.path.abspath(__file__))
_test_dirs = [os.path.join(_here, d) for d in ("", "engine", "provider", "compat")]
os.environ["PYTHONPATH"] = os.pathsep.join([*_test_dirs, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
sys.path[:0] = [d for d in [*_test_dirs, os.path.join(_here, "provider", "dags")] if d not in sys.path]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

# Airflow reads its home when first imported: give the test session its own (SQLite, no
# examples), never the developer's.
AIRFLOW_HOME = tempfile.mkdtemp(prefix="streambatch-airflow-home-")
os.environ["AIRFLOW_HOME"] = AIRFLOW_HOME
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = os.path.join(_here, "provider", "dags")

SPARK_SLOTS = 4


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


@pytest.fixture()
def ctx(spark, tmp_path):
    """A fresh DataContext per test, with blocks under the test's tmp dir."""
    from airflow_streambatch.engine import DataContext

    context = DataContext(block_dir=str(tmp_path / "blocks"), progress_interval_s=0, resources={"CPU": SPARK_SLOTS})
    with context.scoped():
        yield context
