"""DAGs that `airflow standalone`'s own scheduler runs (tests/provider/test_standalone_schedules.py, issue 15).

``sb_standalone_hourly`` is scheduled like the example DAG: the run the scheduler creates
covers the hour that ended, and its paths are that hour's zero-padded ``YYYY-MM-DD/HH``.
A scheduled run has no conf, so its root comes from the Airflow Variable
``sb_standalone_schedule_root`` that the test sets through the REST API. Paused at
creation: it runs only while the test has it unpaused, and a test session that does not
run those tests starts no runs. ``sb_standalone_watermark`` runs only when triggered, with
explicit data interval bounds, and waits for its watermark to pass the interval's end.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, CronDataIntervalTimetable, Param

from airflow_streambatch.operators.streambatch import StreamBatchOperator
from airflow_streambatch.sensors.epoch import EpochSensor

HOUR = "{{ data_interval_start.strftime('%Y-%m-%d/%H') }}"  # as the example DAG and `demo generate`
ROOT_VARIABLE = "sb_standalone_schedule_root"

with DAG("sb_standalone_hourly", schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
         start_date=pendulum.datetime(2026, 11, 1, tz="UTC"), catchup=False, is_paused_upon_creation=True,
         tags=["streambatch-tests"]) as sb_standalone_hourly:
    root = "{{ var.value." + ROOT_VARIABLE + " }}"
    wait = EpochSensor(task_id="wait_for_epoch", input_path=f"{root}/in/{HOUR}", poke_interval=2, timeout=300)
    StreamBatchOperator(
        task_id="score", manifest=wait.output, pipeline="pipelines:score", output_path=f"{root}/out/{HOUR}",
        # one runs directory per hour: a run the scheduler adds for the next hour leaves this hour's alone
        pipeline_kwargs={"runs_dir": f"{root}/runs/{HOUR}"}, data_context={"progress_interval_s": 0},
    )

with DAG("sb_standalone_watermark", schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
         catchup=False, params={"root": Param("/tmp/streambatch-test-data", type="string")},
         render_template_as_native_obj=True, tags=["streambatch-tests"]) as sb_standalone_watermark:
    # timeout: a bound on the test's wait, far above the few pokes it watches the sensor wait
    wait = EpochSensor(task_id="wait_for_epoch", input_path="{{ params.root }}/in/" + HOUR, frontier="watermark",
                       watermark_path="{{ params.root }}/watermark", poke_interval=2, timeout=600)
    StreamBatchOperator(
        task_id="score", manifest=wait.output, pipeline="pipelines:score",
        output_path="{{ params.root }}/out/" + HOUR, pipeline_kwargs={"runs_dir": "{{ params.root }}/runs"},
        data_context={"progress_interval_s": 0},
    )
