"""Epochs on real Airflow 3 timetables under ``dag.test()`` on real local Spark (issue 15).

An hourly run covers the hour that ended (a one-hour data interval, zero-padded paths
of that hour); a manual run of an hour that already ran over unchanged inputs reruns
nothing and succeeds; the watermark frontier refuses the zero-length intervals that
``schedule="@hourly"`` gives in Airflow 3.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pendulum
from pipelines import take_partitions_run, write_inputs

HOUR_09 = "2026-11-22/09"  # the hour 09:00..10:00 UTC, as `python -m airflow_streambatch.demo generate` writes it


def _run(dag, root, logical_date):
    dr = dag.test(logical_date=logical_date, run_after=logical_date, run_conf={"root": str(root)})
    return dr, {ti.task_id: ti.state for ti in dr.get_task_instances()}


def _inputs(root, partitions=3):
    write_inputs(root / "in" / HOUR_09, partitions=partitions)
    (root / "in" / HOUR_09 / "_SUCCESS").write_text("")
    (root / "runs").mkdir()


def _runs(root) -> list[int]:
    return take_partitions_run(root / "runs")


def test_an_hourly_run_processes_the_hour_that_ended_with_zero_padded_paths(ctx, airflow_db, tmp_path):
    from airflow.sdk import CronDataIntervalTimetable
    from epoch_schedule_test_dags import sb_hourly_intervals

    assert isinstance(sb_hourly_intervals.timetable, CronDataIntervalTimetable)
    _inputs(tmp_path)
    dr, states = _run(sb_hourly_intervals, tmp_path, pendulum.datetime(2026, 11, 22, 10, tz="UTC"))
    assert states == {"wait_for_epoch": "success", "score": "success"}
    assert dr.data_interval_end - dr.data_interval_start == pendulum.duration(hours=1)
    assert dr.data_interval_start == pendulum.datetime(2026, 11, 22, 9, tz="UTC")
    record = json.loads((tmp_path / "out" / HOUR_09 / "_epoch.json").read_text())
    assert record["status"] == "succeeded" and len(record["partitions"]) == 3
    assert record["epoch"]["interval_start"].startswith("2026-11-22T09:00:00")
    assert record["epoch"]["interval_end"].startswith("2026-11-22T10:00:00")
    assert all(f"/in/{HOUR_09}/part-" in p["path"] for p in record["partitions"])
    assert sorted(set(_runs(tmp_path))) == [0, 1, 2]


def test_a_manual_run_of_an_hour_that_already_ran_over_unchanged_inputs_reruns_nothing(ctx, airflow_db, tmp_path):
    from epoch_schedule_test_dags import sb_hourly_trigger

    _inputs(tmp_path)
    _, states = _run(sb_hourly_trigger, tmp_path, pendulum.datetime(2026, 11, 22, 10, tz="UTC"))
    assert states["score"] == "success"
    assert sorted(set(_runs(tmp_path))) == [0, 1, 2]
    first = sorted(p.name for p in (tmp_path / "out" / HOUR_09).glob("p*/*.parquet"))

    # triggered by hand at 10:30: the interval is 09:30..10:30, its paths those of hour 09 again
    dr, states = _run(sb_hourly_trigger, tmp_path, pendulum.datetime(2026, 11, 22, 10, 30, tz="UTC"))
    assert dr.data_interval_start == pendulum.datetime(2026, 11, 22, 9, 30, tz="UTC")
    assert states == {"wait_for_epoch": "success", "score": "success"}  # not EpochChangedError
    assert _runs(tmp_path) == []  # nothing ran on Spark
    assert sorted(p.name for p in (tmp_path / "out" / HOUR_09).glob("p*/*.parquet")) == first
    assert json.loads((tmp_path / "out" / HOUR_09 / "_epoch.json").read_text())["status"] == "succeeded"


def test_the_watermark_frontier_refuses_a_zero_length_interval_naming_the_timetable(ctx, airflow_db, tmp_path,
                                                                                    capsys, caplog):
    from epoch_schedule_test_dags import sb_hourly_instants

    _inputs(tmp_path)
    (tmp_path / "watermark").write_text("2026-11-23T00:00:00+00:00")  # long past: only the interval is wrong
    dr, states = _run(sb_hourly_instants, tmp_path, pendulum.datetime(2026, 11, 22, 10, tz="UTC"))
    assert dr.data_interval_start == dr.data_interval_end
    assert states["wait_for_epoch"] == "failed"
    said = capsys.readouterr().out + caplog.text  # dag.test() prints the task's error
    assert "AirflowFailException" in said and "has zero length" in said and "CronDataIntervalTimetable(" in said
    assert not (tmp_path / "out").exists()


def test_the_example_dag_reads_the_hour_that_ended_where_the_demo_writes_it(monkeypatch, tmp_path):
    from airflow.sdk import CronDataIntervalTimetable
    from airflow.serialization.encoders import coerce_to_core_timetable
    from jinja2 import Template

    from airflow_streambatch import demo

    monkeypatch.setenv("STREAMBATCH_DEMO_ROOT", str(tmp_path))
    path = os.path.join(os.path.dirname(__file__), "..", "..", "dags", "text_embedding.py")
    spec = importlib.util.spec_from_file_location("text_embedding_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.embed_text_light
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    timetable = coerce_to_core_timetable(dag.timetable)
    interval = timetable.infer_manual_data_interval(run_after=pendulum.datetime(2026, 11, 22, 10, 20, tz="UTC"))
    assert (interval.start, interval.end) == (pendulum.datetime(2026, 11, 22, 9, tz="UTC"),
                                              pendulum.datetime(2026, 11, 22, 10, tz="UTC"))
    rendered = Template(dag.get_task("wait_for_epoch").input_path).render(data_interval_start=interval.start)
    assert rendered == demo._hour_path(str(tmp_path), "in", interval.start) == f"{tmp_path}/in/{HOUR_09}"
