"""An epoch's output asset event, with the epoch's partition key for partition-aware DAGs.

Airflow 3.2 added asset partitions: an asset event may carry a ``partition_key``, and
a DAG scheduled with ``PartitionedAssetTimetable(assets=...)`` gets one run per key
whose ``dag_run.partition_key`` is that key. An epoch is such a partition: one data
interval of the output. Its key is the DAG run's own ``partition_key`` when the run
has one (a ``CronPartitionTimetable`` run, or a run that a partitioned asset started),
else the epoch's interval start in UTC as ``2026-11-22T09:00:00``: the key format of
``CronPartitionTimetable`` and the input format of the temporal mappers
(``StartOfDayMapper`` ...), so a downstream DAG can also roll hours up into days.

Airflow queues only partition-aware DAGs on a keyed event and only the others on an
event without a key, so the key is opt-in (``output_asset_partitioned=True``): a DAG
already scheduled plainly on the asset (``schedule=[asset]``) keeps running per epoch.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.sdk import Asset

    from airflow_streambatch.epochs.checkpoint import EpochRecord

PARTITION_KEY_FORMAT = "%Y-%m-%dT%H:%M:%S"  # CronPartitionTimetable's key_format, the temporal mappers' input


def epoch_partition_key(interval_start: str, run_partition_key: str | None = None) -> str:
    """The run's own partition key, else the epoch's interval start (ISO, any offset) in UTC."""
    if run_partition_key:
        return run_partition_key
    start = datetime.fromisoformat(interval_start)
    if start.tzinfo is None:
        raise ValueError(f"epoch interval start {interval_start!r} has no UTC offset: cannot name its partition")
    return start.astimezone(UTC).strftime(PARTITION_KEY_FORMAT)


def emit_epoch_event(context: Any, asset: Asset, record: EpochRecord, partitioned: bool) -> str | None:
    """Set the succeeded epoch's event on ``asset``: its summary as ``extra`` and, when ``partitioned``
    (or the run has a partition key, which Airflow gives the event anyway), the epoch's partition key.
    Returns the key, or None for an event without one."""
    accessor = context["outlet_events"][asset]
    accessor.extra = record.summary()
    dag_run = context.get("dag_run")
    run_key = getattr(dag_run, "partition_key", None)
    if not (partitioned or run_key):
        return None
    key = epoch_partition_key(record.epoch["interval_start"], run_key)
    accessor.add_partitions(key)
    return key
