"""``embed_text_light`` in TaskFlow style: the pipeline is the task's own function.

The same epoch as ``text_embedding.py``'s DAGs (each hour's ``$STREAMBATCH_DEMO_ROOT/in/<YYYY-MM-DD>/<HH>/``,
complete at ``_SUCCESS``, embedded into ``$STREAMBATCH_DEMO_ROOT/embeddings/<YYYY-MM-DD>/<HH>/``), with the
pure-NumPy hashing embedder (64 dims, no torch). Instead of ``StreamBatchOperator(pipeline="module:function")``
the function decorated with ``@task.streambatch`` receives the epoch's dataset and the epoch and returns the
pipeline; the arguments of its call (``embed(batch_size=256)``) are its keyword arguments.

Its code, and the helpers it takes from ``text_pipelines`` in the DAG folder, travel by value to
Spark's Python workers, and with ``deploy_mode="spark_submit"`` (``STREAMBATCH_DEPLOY_MODE``, with a
Spark connection in ``STREAMBATCH_SPARK_CONN``) to the spark-submit driver. A failed partition fails
``embed``; clear the task to rerun only that partition. Try it:
``python -m airflow_streambatch.demo run --dag embed_text_taskflow``.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Asset, CronDataIntervalTimetable, Param, task
from text_pipelines import clean, hashing_embed

from airflow_streambatch.sensors.epoch import EpochSensor

ROOT = os.environ.get("STREAMBATCH_DEMO_ROOT", os.path.expanduser("~/streambatch-demo")).rstrip("/") or "/"
SPARK_CONN = os.environ.get("STREAMBATCH_SPARK_CONN") or None
DEPLOY_MODE = os.environ.get("STREAMBATCH_DEPLOY_MODE") or "in_process"
HOUR = "{{ data_interval_start.strftime('%Y-%m-%d/%H') }}"  # the hour that ended: 2026-11-22/09
EMBEDDINGS = Asset(f"{ROOT}/embeddings" if "://" in ROOT else f"file://{ROOT}/embeddings")

with DAG(
    "embed_text_taskflow",
    description="Hourly hashing embeddings (no torch) on Spark, TaskFlow style",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="Europe/Amsterdam"),  # runs cover the hour that ended
    start_date=pendulum.datetime(2026, 11, 1, tz="Europe/Amsterdam"),
    catchup=False,
    max_active_runs=2,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    params={"full_recompute": Param(False, type="boolean", description="recompute the whole epoch")},
    tags=["streambatch", "example"],
    doc_md=__doc__,
):
    # output_path: the sensor writes the epoch manifest beside the output (never under the input)
    wait = EpochSensor(task_id="wait_for_epoch", input_path=f"{ROOT}/in/{HOUR}",
                       output_path=f"{ROOT}/embeddings/{HOUR}", frontier="marker", mode="reschedule",
                       poke_interval=60, timeout=int(timedelta(hours=6).total_seconds()))

    @task.streambatch(manifest=wait.output, output_path=f"{ROOT}/embeddings/{HOUR}", output_asset=EMBEDDINGS,
                      conn_id=SPARK_CONN, deploy_mode=DEPLOY_MODE, full_recompute="{{ params.full_recompute }}",
                      output_asset_partitioned=True)  # one run of embeddings_by_hour.py per epoch
    def embed(ds, epoch, *, batch_size: int = 256, concurrency: int | None = None):
        """Clean on every CPU slot, then the hashing embedder."""
        return (ds.map_batches(clean, batch_size=1024, batch_format="pyarrow")
                  .map_batches(hashing_embed, batch_size=batch_size, concurrency=concurrency,
                               batch_format="pyarrow"))

    embed(batch_size=256)
