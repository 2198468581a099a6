"""The hook's client-mode path against a real standalone cluster started by the test.

The driver runs in a subprocess (this test session already holds a local
SparkSession) that gets its master from an Airflow connection, as a task would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from pipelines import write_inputs
from standalone_cluster import StandaloneCluster

DRIVER = textwrap.dedent("""
    import json, sys
    from airflow_streambatch.epochs import EpochManifest, list_inputs, run_epoch
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    root = sys.argv[1]
    spark = StreamBatchHook("sb_cluster").get_spark_session()
    manifest = EpochManifest("2026-11-22T10:00:00+00:00", "2026-11-22T11:00:00+00:00", list_inputs(root + "/in"))
    record = run_epoch(manifest, "pipelines:score", output_path=root + "/out",
                       pipeline_kwargs={"runs_dir": root + "/runs"})
    conf = spark.sparkContext.getConf()
    print("RESULT " + json.dumps({"master": spark.sparkContext.master, "summary": record.summary(),
                                  "python": conf.get("spark.pyspark.python")}))
""")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = StandaloneCluster(str(tmp_path_factory.mktemp("cluster")), workers=1, cores=2).start()
    yield c
    c.stop()


def test_a_spark_connection_runs_the_epoch_on_the_cluster_in_client_mode(cluster, tmp_path):
    write_inputs(tmp_path / "in", partitions=4)
    env = dict(os.environ, AIRFLOW_CONN_SB_CLUSTER=json.dumps({"conn_type": "spark", "host": cluster.url}))
    env.pop("PYSPARK_PYTHON", None)  # the hook must name the executors' interpreter itself
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"driver printed no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["master"] == cluster.url and result["python"] == sys.executable
    assert result["summary"]["status"] == "succeeded" and result["summary"]["rows"] == 400
