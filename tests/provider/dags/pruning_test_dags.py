"""Sensor -> operator DAGs whose operator prunes its reads: ``columns`` (templated, from the run's
params) and a pyarrow ``row_filter``, in process and through spark-submit.

The sensor splits the tests' Parquet file of 8 row groups (~250 KiB each) into ranges of two
row groups (``max_partition_bytes`` 600 KiB), so a row filter meets partitions that the row
groups' statistics rule out. No schedule: runs only when a test asks.
"""

from __future__ import annotations

import pendulum
import pyarrow.compute as pc
from airflow.sdk import DAG, Param

from airflow_streambatch.operators.streambatch import StreamBatchOperator
from airflow_streambatch.sensors.epoch import EpochSensor

RANGE_BYTES = 600 * 1024
ENGLISH = pc.field("lang") == "en"
PARAMS = {"root": Param("/tmp/streambatch-test-data", type="string"), "columns": Param(["id"], type="array"),
          "fail_from": Param(-1, type="integer")}


def pruned_dag(dag_id: str, **operator_kwargs) -> DAG:
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"), catchup=False,
             params=PARAMS, render_template_as_native_obj=True, tags=["streambatch-tests"]) as dag:
        wait = EpochSensor(task_id="wait_for_epoch", input_path="{{ params.root }}/in/{{ ds }}", poke_interval=1,
                           timeout=120, max_partition_bytes=RANGE_BYTES)
        StreamBatchOperator(
            task_id="score", manifest=wait.output, pipeline="pruning_pipelines:report_batches",
            output_path="{{ params.root }}/out/{{ ds }}", columns="{{ params.columns }}", row_filter=ENGLISH,
            pipeline_kwargs={"report_dir": "{{ params.root }}/reports", "fail_flag": "{{ params.root }}/fail",
                             "fail_from": "{{ params.fail_from }}"},
            data_context={"progress_interval_s": 0}, **operator_kwargs,
        )
    return dag


sb_epoch_pruned = pruned_dag("sb_epoch_pruned")
sb_epoch_pruned_spark_submit = pruned_dag("sb_epoch_pruned_spark_submit", deploy_mode="spark_submit",
                                          streambatch_conn_id="spark_local")
