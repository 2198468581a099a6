"""DAGs on real Airflow 3 timetables, run by ``dag.test()`` (tests/provider/test_epoch_schedules.py).

Paths come from the data interval as the example DAG (dags/text_embedding.py) builds
them, under the run's conf ``params.root``. Paused at creation: the ``airflow standalone``
tests' scheduler parses this folder and must start no runs.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, CronDataIntervalTimetable, CronTriggerTimetable, Param

from airflow_streambatch.operators.streambatch import StreamBatchOperator
from airflow_streambatch.sensors.epoch import EpochSensor

HOUR = "{{ data_interval_start.strftime('%Y-%m-%d/%H') }}"  # as the example DAG and the demo's generate


def hourly_dag(dag_id: str, timetable, frontier: str = "marker") -> DAG:
    with DAG(dag_id, schedule=timetable, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
             catchup=False, is_paused_upon_creation=True,
             params={"root": Param("/tmp/streambatch-test-data", type="string")},
             render_template_as_native_obj=True, tags=["streambatch-tests"]) as dag:
        wait = EpochSensor(task_id="wait_for_epoch", input_path="{{ params.root }}/in/" + HOUR, frontier=frontier,
                           watermark_path="{{ params.root }}/watermark", poke_interval=1, timeout=60)
        StreamBatchOperator(
            task_id="score", manifest=wait.output, pipeline="pipelines:score",
            output_path="{{ params.root }}/out/" + HOUR, pipeline_kwargs={"runs_dir": "{{ params.root }}/runs"},
            data_context={"progress_interval_s": 0},
        )
    return dag


# what the example DAG uses: the run at 10:00 covers 09:00..10:00
sb_hourly_intervals = hourly_dag("sb_hourly_intervals", CronDataIntervalTimetable("0 * * * *", timezone="UTC"))
# the same with a trigger timetable and an interval: a manual run at 10:30 covers 09:30..10:30
sb_hourly_trigger = hourly_dag("sb_hourly_trigger",
                               CronTriggerTimetable("0 * * * *", timezone="UTC", interval=timedelta(hours=1)))
# Airflow 3's meaning of schedule="@hourly": zero-length intervals, refused by the watermark frontier
sb_hourly_instants = hourly_dag("sb_hourly_instants", "@hourly", frontier="watermark")
