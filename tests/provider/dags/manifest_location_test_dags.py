"""DAGs of `test_manifest_locations.py`: where the sensor puts the epoch manifest (issue 33, item 5).

Paths come from the run's conf (``params.root``, or ``params.store`` for an ``s3://`` bucket).
No schedule: a scheduler must not start runs the tests did not ask for.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from airflow_streambatch.operators.streambatch import StreamBatchOperator
from airflow_streambatch.sensors.epoch import EpochSensor

OUTPUT = "{{ params.root }}/out/{{ ds }}"


def manifest_dag(dag_id: str, *, beside_output: bool = False, operator: bool = True,
                 deferrable: bool = False) -> DAG:
    """Sensor (told the output with ``beside_output``, else no location of its own) -> operator."""
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"), catchup=False,
             params={"root": Param("/tmp/streambatch-test-data", type="string")},
             render_template_as_native_obj=True, tags=["streambatch-tests"]) as dag:
        wait = EpochSensor(task_id="wait_for_epoch", input_path="{{ params.root }}/in/{{ ds }}", poke_interval=1,
                           timeout=60, deferrable=deferrable, output_path=OUTPUT if beside_output else None)
        if operator:
            StreamBatchOperator(task_id="score", manifest=wait.output, pipeline="pipelines:score", output_path=OUTPUT,
                                pipeline_kwargs={"runs_dir": "{{ params.root }}/runs"},
                                data_context={"progress_interval_s": 0})
    return dag


sb_manifest_beside_output = manifest_dag("sb_manifest_beside_output", beside_output=True)
sb_manifest_unplaced = manifest_dag("sb_manifest_unplaced")
sb_manifest_sensor_only = manifest_dag("sb_manifest_sensor_only", operator=False)
sb_manifest_sensor_only_deferrable = manifest_dag("sb_manifest_sensor_only_deferrable", operator=False,
                                                  deferrable=True)
