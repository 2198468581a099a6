"""DAGs whose epoch sleeps in Spark, to interrupt it: by execution_timeout, or by SIGTERM from a test.

Paths come from the run's conf (``params.root``): inputs under ``<root>/in``, output
``<root>/out``, the engine's blocks under ``<root>/blocks``.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param

from airflow_streambatch.operators.streambatch import StreamBatchOperator


def interrupt_dag(dag_id: str, execution_timeout: timedelta | None, **operator_kwargs) -> DAG:
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"), catchup=False,
             params={"root": Param("/tmp/streambatch-interrupt", type="string")},
             render_template_as_native_obj=True, tags=["streambatch-tests"]) as dag:
        StreamBatchOperator(
            task_id="sleepy", input_path="{{ params.root }}/in", output_path="{{ params.root }}/out",
            pipeline="interrupt_pipelines:sleepy", pipeline_kwargs={"started_dir": "{{ params.root }}/started"},
            data_context={"block_dir": "{{ params.root }}/blocks", "progress_interval_s": 0},
            execution_timeout=execution_timeout, **operator_kwargs,
        )
    return dag


sb_timeout = interrupt_dag("sb_timeout", timedelta(seconds=10))
sb_sigterm = interrupt_dag("sb_sigterm", None)
# spark-submit starts its own JVM and driver first (10-20 s on a small machine)
sb_timeout_spark_submit = interrupt_dag("sb_timeout_spark_submit", timedelta(seconds=40), deploy_mode="spark_submit",
                                        streambatch_conn_id="spark_local")
