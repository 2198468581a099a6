"""DAGs the provider tests run: by ``dag.test()`` in-process and by ``airflow standalone``.

Every path comes from the run's conf (``params.root``), so each test points the same
DAG at its own directories. Templates render as native objects (lists stay lists).
No schedule: a scheduler must not start runs the tests did not ask for.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Asset, Param

from airflow_streambatch.operators.streambatch import StreamBatchOperator
from airflow_streambatch.sensors.epoch import EpochSensor

SCORES = Asset("file:///streambatch-tests/scores")
PARAMS = {
    "root": Param("/tmp/streambatch-test-data", type="string"),
    "fail_partitions": Param([], type="array"),
    "kill_driver_on": Param(-1, type="integer"),
    "full_recompute": Param(False, type="boolean"),
    "reject_ids": Param([], type="array"),  # rows the scorer always fails on (`pipelines.score`)
}


def epoch_dag(dag_id: str, *, retries: int = 0, deferrable: bool = False, mode: str = "poke", frontier: str = "marker",
              deploy_mode: str = "in_process", conn_id: str | None = None, on_store: bool = False,
              output_format: str = "parquet", on_row_error: str = "fail") -> DAG:
    """``on_store``: input and output under ``params.store`` (an ``s3://`` bucket), the test's
    run logs and flags still under ``params.root``. A table format writes every epoch into
    one table, ``<store>/scores_<format>``. The sensor is told the output: its manifest goes beside it."""
    params, data = (({**PARAMS, "store": Param("s3://streambatch-tests", type="string")}, "params.store")
                    if on_store else (PARAMS, "params.root"))
    output = (f"{{{{ {data} }}}}/out/{{{{ ds }}}}" if output_format == "parquet"
              else f"{{{{ {data} }}}}/scores_{output_format}")
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"), catchup=False,
             params=params, render_template_as_native_obj=True, tags=["streambatch-tests"]) as dag:
        wait = EpochSensor(task_id="wait_for_epoch", input_path=f"{{{{ {data} }}}}/in/{{{{ ds }}}}", poke_interval=1,
                           timeout=120, deferrable=deferrable, mode=mode, frontier=frontier, quiet_period=2,
                           output_path=output)
        StreamBatchOperator(
            task_id="score", manifest=wait.output, pipeline="pipelines:score", output_path=output,
            output_format=output_format,
            pipeline_kwargs={"runs_dir": "{{ params.root }}/runs", "fail_flag": "{{ params.root }}/fail",
                             "fail_partitions": "{{ params.fail_partitions }}",
                             "kill_driver_on": "{{ params.kill_driver_on }}",
                             "reject_ids": "{{ params.reject_ids }}"},
            data_context={"progress_interval_s": 0, "on_row_error": on_row_error},
            full_recompute="{{ params.full_recompute }}", retries=retries, retry_delay=timedelta(seconds=1),
            output_asset=SCORES,
            deploy_mode=deploy_mode, streambatch_conn_id=conn_id,
        )
    return dag


sb_epoch = epoch_dag("sb_epoch")
sb_epoch_retry = epoch_dag("sb_epoch_retry", retries=1)
sb_epoch_deferrable = epoch_dag("sb_epoch_deferrable", deferrable=True)
sb_epoch_quiet = epoch_dag("sb_epoch_quiet", mode="reschedule", frontier="quiescence")
sb_epoch_s3 = epoch_dag("sb_epoch_s3", on_store=True)
sb_epoch_quarantine = epoch_dag("sb_epoch_quarantine", on_row_error="quarantine")
sb_epoch_s3_delta = epoch_dag("sb_epoch_s3_delta", on_store=True, output_format="delta")
sb_epoch_spark_submit = epoch_dag("sb_epoch_spark_submit", deploy_mode="spark_submit", conn_id="spark_local")


STORE_OUTPUT = "{{ params.store }}/out/{{ ds }}"


def store_credentials_dag(dag_id: str, *, sensor: dict | None = None, **operator_kwargs) -> DAG:
    """An epoch read from and written to ``params.store`` (an ``s3://`` bucket) with the credentials of the
    ``sb_s3`` connection (`test_object_store_epochs.py`). Without ``sensor`` the operator lists its input;
    with it (the sensor's own keyword arguments) an `EpochSensor` with the same connection freezes it
    (``output_path=STORE_OUTPUT`` among them: its manifest beside the output; none: XCom carries it whole)."""
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"), catchup=False,
             params={"store": Param("s3://streambatch-tests", type="string"),
                     "root": Param("/tmp/streambatch-test-data", type="string")},
             render_template_as_native_obj=True, tags=["streambatch-tests"]) as dag:
        epoch_input: dict = {"input_path": "{{ params.store }}/in/{{ ds }}"}
        if sensor is not None:
            wait = EpochSensor(task_id="wait_for_epoch", input_path="{{ params.store }}/in/{{ ds }}",
                               storage_conn_id="sb_s3", poke_interval=1, timeout=60, **sensor)
            epoch_input = {"manifest": wait.output}
        StreamBatchOperator(task_id="score", pipeline="pipelines:record_environment", **epoch_input,
                            output_path=STORE_OUTPUT,
                            pipeline_kwargs={"report_dir": "{{ params.root }}/env"},
                            data_context={"progress_interval_s": 0}, storage_conn_id="sb_s3", **operator_kwargs)
    return dag


sb_store_in_process = store_credentials_dag("sb_store_in_process")
sb_store_spark_submit = store_credentials_dag("sb_store_spark_submit", deploy_mode="spark_submit",
                                              streambatch_conn_id="spark_local")
sb_store_sensed = store_credentials_dag("sb_store_sensed", sensor={})
sb_store_sensed_deferrable = store_credentials_dag("sb_store_sensed_deferrable",
                                                  sensor={"deferrable": True, "output_path": STORE_OUTPUT})
