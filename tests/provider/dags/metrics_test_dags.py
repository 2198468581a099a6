"""A DAG whose epoch, on the S3 server, sleeps in Spark until its execution_timeout interrupts it.

The metrics test reads what the interrupted run left in its epoch record on S3. Inputs
under ``<store>/in``, output ``<store>/out``; the pipeline's start marks and the engine's
blocks under ``params.root``.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param

from airflow_streambatch.operators.streambatch import StreamBatchOperator

with DAG("sb_metrics_timeout_s3", schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"), catchup=False,
         params={"root": Param("/tmp/streambatch-metrics", type="string"),
                 "store": Param("s3://streambatch-tests", type="string")},
         render_template_as_native_obj=True, tags=["streambatch-tests"]) as sb_metrics_timeout_s3:
    StreamBatchOperator(
        task_id="sleepy", input_path="{{ params.store }}/in", output_path="{{ params.store }}/out",
        pipeline="interrupt_pipelines:sleepy", pipeline_kwargs={"started_dir": "{{ params.root }}/started"},
        data_context={"block_dir": "{{ params.root }}/blocks", "progress_interval_s": 0},
        execution_timeout=timedelta(seconds=10),
    )
