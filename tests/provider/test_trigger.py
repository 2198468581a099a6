"""EpochTrigger on a real event loop and real files, as the triggerer runs it."""

from __future__ import annotations

import asyncio
import importlib
import threading
import time

from pipelines import write_inputs


def _first_event(trigger, timeout=30.0):
    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(first(), timeout))


def _from_serialized(trigger):
    path, kwargs = trigger.serialize()
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)(**kwargs)


def test_trigger_fires_once_the_marker_appears_with_the_frozen_manifest(tmp_path):
    from airflow_streambatch.triggers.epoch import EpochTrigger

    write_inputs(tmp_path / "in", partitions=3)
    trigger = EpochTrigger(input_path=str(tmp_path / "in"), frontier="marker",
                           interval_start="2026-11-22T10:00:00+00:00", interval_end="2026-11-22T11:00:00+00:00",
                           poll_interval=0.2)
    threading.Timer(1.0, (tmp_path / "in" / "_SUCCESS").write_text, args=("",)).start()
    started = time.monotonic()
    event = _first_event(_from_serialized(trigger))  # the triggerer rebuilds it from serialize()
    assert time.monotonic() - started >= 1.0
    assert event["status"] == "passed"
    assert [p["path"].rsplit("/", 1)[-1] for p in event["manifest"]["partitions"]] == [
        "part-000.parquet", "part-001.parquet", "part-002.parquet"]
    assert event["manifest"]["interval_end"] == "2026-11-22T11:00:00+00:00"


def test_trigger_reports_a_malformed_watermark_as_an_error_event(tmp_path):
    from airflow_streambatch.triggers.epoch import EpochTrigger

    (tmp_path / "watermark").write_text("soon")
    trigger = EpochTrigger(input_path=str(tmp_path / "in"), frontier="watermark",
                           watermark_path=str(tmp_path / "watermark"), interval_start="2026-11-22T10:00:00+00:00",
                           interval_end="2026-11-22T11:00:00+00:00", poll_interval=0.2)
    event = _first_event(trigger)
    assert event["status"] == "error" and "ISO-8601" in event["message"]


def test_quiescence_restarts_when_files_keep_arriving(tmp_path):
    from airflow_streambatch.triggers.epoch import EpochTrigger

    write_inputs(tmp_path / "in", partitions=1)
    trigger = EpochTrigger(input_path=str(tmp_path / "in"), frontier="quiescence", quiet_period_s=1.5,
                           interval_start="2026-11-22T10:00:00+00:00", interval_end="2026-11-22T11:00:00+00:00",
                           poll_interval=0.2)
    threading.Timer(1.0, write_inputs, args=(tmp_path / "in",), kwargs={"partitions": 2}).start()
    started = time.monotonic()
    event = _first_event(trigger)
    assert time.monotonic() - started >= 2.5  # 1 s until the second file, then 1.5 s quiet
    assert len(event["manifest"]["partitions"]) == 2
