"""A sensor -> operator DAG whose sensor splits Parquet files into row-group ranges.

``max_partition_bytes`` is 32 KiB, so the tests' small file of 16 row groups (about
7 KiB each) becomes several partitions, standing in for a 2 GiB file of 16 row groups
under the 128 MiB default. No schedule: runs only when a test asks.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from airflow_streambatch.operators.streambatch import StreamBatchOperator
from airflow_streambatch.sensors.epoch import EpochSensor

SMALL_PARTITION_BYTES = 32 * 1024
PARAMS = {"root": Param("/tmp/streambatch-test-data", type="string"), "fail_partitions": Param([], type="array")}

with DAG("sb_epoch_row_groups", schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"), catchup=False,
         params=PARAMS,
         render_template_as_native_obj=True, tags=["streambatch-tests"]) as sb_epoch_row_groups:
    wait = EpochSensor(task_id="wait_for_epoch", input_path="{{ params.root }}/in/{{ ds }}", poke_interval=1,
                       timeout=120, max_partition_bytes=SMALL_PARTITION_BYTES)
    StreamBatchOperator(
        task_id="score", manifest=wait.output, pipeline="pipelines:score",
        output_path="{{ params.root }}/out/{{ ds }}",
        pipeline_kwargs={"runs_dir": "{{ params.root }}/runs", "fail_flag": "{{ params.root }}/fail",
                         "fail_partitions": "{{ params.fail_partitions }}"},
        data_context={"progress_interval_s": 0},
    )

with DAG("sb_epoch_row_groups_no_sensor", schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
         catchup=False, params=PARAMS, render_template_as_native_obj=True,
         tags=["streambatch-tests"]) as sb_epoch_row_groups_no_sensor:
    StreamBatchOperator(  # no sensor: the operator lists input_path itself, and splits as the sensor does
        task_id="score", input_path="{{ params.root }}/in/{{ ds }}", pipeline="pipelines:score",
        output_path="{{ params.root }}/out/{{ ds }}", max_partition_bytes=SMALL_PARTITION_BYTES,
        pipeline_kwargs={"runs_dir": "{{ params.root }}/runs", "fail_flag": "{{ params.root }}/fail",
                         "fail_partitions": "{{ params.fail_partitions }}"},
        data_context={"progress_interval_s": 0},
    )
