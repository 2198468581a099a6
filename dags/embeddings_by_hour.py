"""One run per embedded hour: a DAG scheduled on the embeddings asset by partition.

``embed_text_hourly``, ``embed_text_light`` and ``embed_text_taskflow`` give their
``EMBEDDINGS`` event the epoch's partition key (``output_asset_partitioned=True``): the
hour's start in UTC, e.g. ``2026-11-22T08:00:00``. Scheduled with
``PartitionedAssetTimetable(assets=EMBEDDINGS)``, this DAG gets one run per key, with
``dag_run.partition_key`` set: once for every epoch that succeeds, whether a scheduled
run, a retry or Clear of a failed one, or a backfill committed it; a failed epoch
starts nothing. Each run publishes its hour to a small catalog,
``$STREAMBATCH_DEMO_ROOT/catalog/<key>.json``: where the hour's embeddings are, their
rows and the input fingerprint, from the event's summary. A rerun of an hour (its
event again) rewrites the same entry.
"""

from __future__ import annotations

import json
import os

import pendulum
from airflow.sdk import DAG, Asset, PartitionedAssetTimetable, task

from airflow_streambatch.engine.filesystems import resolve

ROOT = os.environ.get("STREAMBATCH_DEMO_ROOT", os.path.expanduser("~/streambatch-demo")).rstrip("/") or "/"
EMBEDDINGS = Asset(f"{ROOT}/embeddings" if "://" in ROOT else f"file://{ROOT}/embeddings")  # as text_embedding.py


with DAG(
    "embeddings_by_hour",
    description="Publish each embedded hour to the catalog, one run per epoch (partitioned asset)",
    schedule=PartitionedAssetTimetable(assets=EMBEDDINGS),
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    tags=["streambatch", "example"],
    doc_md=__doc__,
):

    @task
    def publish_hour(**context) -> dict:
        """Write the catalog entry of the hour this run's partition key names (the latest event for it)."""
        key = context["dag_run"].partition_key
        events = [e for e in context["triggering_asset_events"][EMBEDDINGS] if e.partition_key == key]
        if not events:
            raise ValueError(f"run for hour {key!r} has no {EMBEDDINGS.uri} event with that partition key")
        summary = events[-1].extra
        entry = {"hour": key, "embeddings": summary["output_path"], "rows": summary["rows"],
                 "partitions": summary["partitions"], "fingerprint": summary["fingerprint"]}
        fs, catalog = resolve(f"{ROOT}/catalog")
        fs.create_dir(catalog, recursive=True)
        with fs.open_output_stream(f"{catalog}/{key}.json") as out:
            out.write(json.dumps(entry).encode())
        return entry

    publish_hour()
