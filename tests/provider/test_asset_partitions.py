"""The epoch's output asset event and its partition key, as the Task SDK sends it to Airflow (issue 30).

Built on the Task SDK's own outlet accessors, DagRun model and the serializer its task
runner sends outlet events with; the scheduler's side (a partitioned DAG run per key) is
tested on `airflow standalone` in test_standalone_epoch_partitions.py.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from airflow.sdk import Asset
from airflow.sdk.api.datamodels._generated import DagRun
from airflow.sdk.execution_time.context import OutletEventAccessors
from airflow.sdk.execution_time.task_runner import _serialize_outlet_events

from airflow_streambatch.epochs.checkpoint import EpochRecord
from airflow_streambatch.epochs.manifest import EpochManifest
from airflow_streambatch.operators.asset_partitions import emit_epoch_event, epoch_partition_key

ASSET = Asset("file:///streambatch-tests/asset-partitions")


def _record(start: str, end: str) -> EpochRecord:
    record = EpochRecord.start(EpochManifest(start, end, []), "/data/out/2026-11-22/09")
    record.status = "succeeded"
    return record


def _dag_run(partition_key: str | None) -> DagRun:
    at = datetime(2026, 11, 22, 10, tzinfo=UTC)
    return DagRun(dag_id="d", run_id="r", logical_date=at, data_interval_start=at, data_interval_end=at,
                  run_after=at, start_date=at, end_date=None, run_type="scheduled", state="running",
                  consumed_asset_events=[], partition_key=partition_key)


def _sent(context) -> list[dict]:
    return list(_serialize_outlet_events(context["outlet_events"]))


def test_the_key_is_the_interval_start_in_utc_in_the_temporal_mappers_format():
    assert epoch_partition_key("2026-11-22T10:00:00+01:00") == "2026-11-22T09:00:00"  # Europe/Amsterdam's 10:00
    assert epoch_partition_key("2026-11-22T09:00:00+00:00") == "2026-11-22T09:00:00"
    assert epoch_partition_key("2026-11-22T09:00:00+00:00", "region=eu/2026-11-22") == "region=eu/2026-11-22"
    with pytest.raises(ValueError, match="no UTC offset"):
        epoch_partition_key("2026-11-22T09:00:00")


def test_a_partitioned_output_asset_event_carries_the_epoch_key():
    context = {"outlet_events": OutletEventAccessors(), "dag_run": _dag_run(None)}
    record = _record("2026-11-22T10:00:00+01:00", "2026-11-22T11:00:00+01:00")
    assert emit_epoch_event(context, ASSET, record, partitioned=True) == "2026-11-22T09:00:00"
    (event,) = _sent(context)
    assert event["partition_key"] == "2026-11-22T09:00:00"
    assert event["extra"] == record.summary() and event["dest_asset_key"]["uri"] == ASSET.uri


def test_the_run_own_partition_key_wins():
    context = {"outlet_events": OutletEventAccessors(), "dag_run": _dag_run("2026-11-22")}
    emit_epoch_event(context, ASSET, _record("2026-11-22T00:00:00+00:00", "2026-11-23T00:00:00+00:00"),
                     partitioned=True)
    assert [e["partition_key"] for e in _sent(context)] == ["2026-11-22"]


def test_without_the_flag_the_event_has_no_key_so_plain_asset_schedules_still_run():
    context = {"outlet_events": OutletEventAccessors(), "dag_run": _dag_run(None)}
    record = _record("2026-11-22T09:00:00+00:00", "2026-11-22T10:00:00+00:00")
    assert emit_epoch_event(context, ASSET, record, partitioned=False) is None
    (event,) = _sent(context)
    assert "partition_key" not in event and event["extra"]["interval_start"] == "2026-11-22T09:00:00+00:00"
