"""DAGs for epochs as partitioned assets and backfills of epochs (tests/provider/test_standalone_epoch_partitions.py).

``sb_epoch_backfill`` is an hourly epoch DAG that only backfills run: its ``end_date`` is
in the past, so the scheduler creates no run of its own, and each backfill passes the
test's root as ``dag_run_conf``. Partition 1 of an hour fails while ``<root>/fail/<hour>``
exists. Its output asset event carries the epoch's partition key
(``output_asset_partitioned=True``), and ``sb_epoch_partition_consumer``, scheduled on
that asset by partition, runs once per succeeded epoch with its key and counts the rows
the epoch committed, found through the event's summary.
"""

from __future__ import annotations

import glob

import pendulum
import pyarrow.parquet as pq
from airflow.sdk import DAG, Asset, CronDataIntervalTimetable, Param, PartitionedAssetTimetable, task

from airflow_streambatch.operators.streambatch import StreamBatchOperator

HOUR = "{{ data_interval_start.strftime('%Y-%m-%d/%H') }}"
EPOCHS = Asset("file:///streambatch-tests/partitioned-epochs")
ROOT = "{{ params.root }}"

with DAG("sb_epoch_backfill", schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
         start_date=pendulum.datetime(2026, 11, 20, tz="UTC"), end_date=pendulum.datetime(2026, 11, 20, 6, tz="UTC"),
         catchup=False, params={"root": Param("/tmp/streambatch-test-data", type="string")},
         tags=["streambatch-tests"]) as sb_epoch_backfill:
    StreamBatchOperator(
        task_id="score", input_path=f"{ROOT}/in/{HOUR}", pipeline="pipelines:score", output_path=f"{ROOT}/out/{HOUR}",
        pipeline_kwargs={"runs_dir": f"{ROOT}/runs/{HOUR}", "fail_flag": f"{ROOT}/fail/{HOUR}", "fail_partitions": [1]},
        output_asset=EPOCHS, output_asset_partitioned=True, data_context={"progress_interval_s": 0}, retries=0,
    )

with DAG("sb_epoch_partition_consumer", schedule=PartitionedAssetTimetable(assets=EPOCHS),
         start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
         tags=["streambatch-tests"]) as sb_epoch_partition_consumer:

    @task
    def count_epoch_rows(**context) -> dict:
        """The rows of the epoch this run's partition key names, read from the output its event points to."""
        key = context["dag_run"].partition_key
        events = [e for e in context["triggering_asset_events"][EPOCHS] if e.partition_key == key]
        if len(events) != 1:
            raise ValueError(f"run for partition {key!r}: {len(events)} event(s) of {EPOCHS.uri} with that key")
        summary = events[0].extra
        files = glob.glob(f"{summary['output_path']}/p*/*.parquet")
        return {"partition_key": key, "interval_start": summary["interval_start"],
                "rows": sum(pq.read_metadata(f).num_rows for f in files), "summary_rows": summary["rows"]}

    count_epoch_rows()
