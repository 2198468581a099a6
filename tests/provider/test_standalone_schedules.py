"""Epochs on real Airflow schedules, on `airflow standalone` through its REST API (issue 15).

`test_epoch_schedules.py` shows the same with ``dag.test()``, which creates the run
itself; here the run the hourly DAG processes is one the real scheduler created, a
manual trigger of that hour lets Airflow infer its interval, and the watermark sensor
waits in a real worker for the watermark to pass the interval's END, not its start.
The DAGs are in dags/standalone_schedule_test_dags.py.
"""

from __future__ import annotations

import glob
import json
import os
import time
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipelines import partitions_run, write_inputs
from standalone_schedule_test_dags import ROOT_VARIABLE

HOURLY = "sb_standalone_hourly"
WATERMARK = "sb_standalone_watermark"
INPUT_PARTITIONS = 3


def _hour_path(hour: datetime) -> str:
    return hour.strftime("%Y-%m-%d/%H")  # zero-padded, as `python -m airflow_streambatch.demo generate` writes


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _output_ids(directory) -> list[int]:
    return sorted(i for f in glob.glob(f"{directory}/p*/*.parquet") for i in pq.read_table(f)["id"].to_pylist())


def _output_mtimes(directory) -> dict[str, int]:
    return {f: os.stat(f).st_mtime_ns for f in glob.glob(f"{directory}/p*/*.parquet")}


def _until(what: str, ready, timeout: float, log_path: str, every: float = 2):
    """``ready()``'s first truthy value, polled for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"{what}: not after {timeout} s; see {log_path}")


@pytest.fixture(scope="module")
def standalone(standalone):
    """The session's shared server (tests/provider/conftest.py), once it has parsed this module's DAGs."""
    standalone.wait_dags([HOURLY, WATERMARK])
    return standalone


@pytest.fixture(scope="module")
def scheduled_run(standalone, tmp_path_factory):
    """The first run the scheduler creates once the hourly DAG is unpaused, finished.

    Inputs go in before the unpause, for the hour that last ended, the one before it and
    the current one. The scheduler plans a DAG's next interval when it parses the DAG, so
    an hour that turned between that parse and this write leaves the run on the hour
    before the one that last ended (CI saw a run of 04:00 created at 06:00:11); an hour
    that turns before the scheduler creates the run gives the hour that was current when
    the test wrote. The DAG stays unpaused for the module (a paused DAG's manual runs are
    never scheduled) and is paused again at the end.
    """
    root = tmp_path_factory.mktemp("scheduled")
    current = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    written = [current - timedelta(hours=2), current - timedelta(hours=1), current]
    for hour in written:
        write_inputs(root / "in" / _hour_path(hour), partitions=INPUT_PARTITIONS)
        (root / "in" / _hour_path(hour) / "_SUCCESS").write_text("")
    standalone.call("POST", "/variables", {"key": ROOT_VARIABLE, "value": str(root)})
    assert standalone.call("GET", f"/dags/{HOURLY}")["is_paused"], "paused at creation: no run before the inputs"
    standalone.call("PATCH", f"/dags/{HOURLY}", {"is_paused": False})
    try:
        def first_scheduled():
            runs = standalone.call("GET", f"/dags/{HOURLY}/dagRuns?order_by=logical_date")["dag_runs"]
            return next((r for r in runs if r["run_type"] == "scheduled"), None)

        run = _until(f"a scheduled run of {HOURLY}", first_scheduled, 180, standalone.log_path)
        standalone.wait_run(HOURLY, run["dag_run_id"], timeout=600)
        yield {"root": root, "written": written,
               "run": standalone.call("GET", f"/dags/{HOURLY}/dagRuns/{run['dag_run_id']}")}
    finally:
        standalone.call("PATCH", f"/dags/{HOURLY}", {"is_paused": True})


def test_the_scheduled_hourly_run_processes_the_hour_that_ended(standalone, scheduled_run):
    run, root = scheduled_run["run"], scheduled_run["root"]
    start, end = _time(run["data_interval_start"]), _time(run["data_interval_end"])
    created = _time(run["queued_at"])
    assert end - start == timedelta(hours=1), run
    latest_ended = created.replace(minute=0, second=0, microsecond=0)
    # the latest hour that had ended when the scheduler created the run (or the one before it, when the
    # hour turned between the scheduler's last look at the DAG and its creating the run)
    assert end in (latest_ended, latest_ended - timedelta(hours=1)), (run, created)
    assert start in scheduled_run["written"], f"the run covers {start}, the test wrote {scheduled_run['written']}"
    assert run["state"] == "success", f"{run}; see {standalone.log_path}"

    hour = _hour_path(start)
    record = json.loads((root / "out" / hour / "_epoch.json").read_text())
    assert record["status"] == "succeeded" and len(record["partitions"]) == INPUT_PARTITIONS
    assert _time(record["epoch"]["interval_start"]) == start and _time(record["epoch"]["interval_end"]) == end
    assert all(f"/in/{hour}/part-" in p["path"] for p in record["partitions"])
    assert _output_ids(root / "out" / hour) == list(range(100 * INPUT_PARTITIONS))  # every input row
    assert sorted(set(partitions_run(root / "runs" / hour))) == list(range(INPUT_PARTITIONS))


def test_a_manual_trigger_of_an_hour_that_already_ran_reruns_nothing(standalone, scheduled_run):
    scheduled, root = scheduled_run["run"], scheduled_run["root"]
    assert scheduled["state"] == "success"
    hour = _hour_path(_time(scheduled["data_interval_start"]))
    markers_before = sorted(os.listdir(root / "runs" / hour))
    outputs_before = _output_mtimes(root / "out" / hour)
    assert markers_before and outputs_before

    # as from the UI's Trigger form: a logical date at the hour's end, Airflow infers the interval
    run_id = standalone.call("POST", f"/dags/{HOURLY}/dagRuns",
                             {"logical_date": scheduled["data_interval_end"]})["dag_run_id"]
    manual = standalone.call("GET", f"/dags/{HOURLY}/dagRuns/{run_id}")
    assert manual["run_type"] == "manual"
    assert (_time(manual["data_interval_start"]), _time(manual["data_interval_end"])) == (
        _time(scheduled["data_interval_start"]), _time(scheduled["data_interval_end"]))
    assert standalone.wait_run(HOURLY, run_id, timeout=600) == "success"

    assert sorted(os.listdir(root / "runs" / hour)) == markers_before  # no map task ran
    assert _output_mtimes(root / "out" / hour) == outputs_before  # no output file rewritten
    xcom = standalone.call("GET", f"/dags/{HOURLY}/dagRuns/{run_id}/taskInstances/score/xcomEntries/return_value")
    summary = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert summary["status"] == "succeeded", summary
    assert (summary["committed"], summary["committed_this_try"]) == (INPUT_PARTITIONS, 0), summary
    log = standalone.task_log(HOURLY, run_id, "score", 1)
    assert f"{INPUT_PARTITIONS}/{INPUT_PARTITIONS} partition(s) committed (0 by this try)" in log


def test_the_watermark_sensor_waits_for_the_interval_end_not_its_start(standalone, tmp_path):
    day = "2026-11-22"
    inputs = tmp_path / "in" / day / "10"
    write_inputs(inputs, partitions=INPUT_PARTITIONS)
    (tmp_path / "watermark").write_text(f"{day}T10:30:00+00:00")  # past the start, short of the end
    run_id = standalone.call("POST", f"/dags/{WATERMARK}/dagRuns", {
        "logical_date": f"{day}T10:00:00Z", "data_interval_start": f"{day}T10:00:00Z",
        "data_interval_end": f"{day}T11:00:00Z", "conf": {"root": str(tmp_path)}})["dag_run_id"]

    def pokes_waiting() -> int:
        state = standalone.task(WATERMARK, run_id, "wait_for_epoch")["state"]
        assert state in (None, "scheduled", "queued", "running"), (
            f"the sensor ended ({state}) with the watermark at 10:30, short of the interval end 11:00")
        if state != "running":
            return 0
        return standalone.task_log(WATERMARK, run_id, "wait_for_epoch", 1).count("frontier not passed yet")

    _until("the sensor poking three times without passing", lambda: pokes_waiting() >= 3, 300,
           standalone.log_path)
    assert standalone.call("GET", f"/dags/{WATERMARK}/dagRuns/{run_id}")["state"] == "running"
    assert standalone.task(WATERMARK, run_id, "wait_for_epoch")["state"] == "running"
    assert standalone.task(WATERMARK, run_id, "score")["state"] in (None, "none", "scheduled")
    assert not (tmp_path / "out").exists()

    late_ids = list(range(100 * INPUT_PARTITIONS, 100 * INPUT_PARTITIONS + 100))  # the rows of 10:45
    pq.write_table(pa.table({"id": late_ids, "text": [f"row {n}" for n in late_ids]}), tmp_path / "late.parquet")
    (tmp_path / "late.parquet").rename(inputs / "part-1045.parquet")  # whole at once, as producers publish
    (tmp_path / "watermark").write_text(f"{day}T11:00:00+00:00")
    assert standalone.wait_run(WATERMARK, run_id, timeout=600) == "success"
    record = json.loads((tmp_path / "out" / day / "10" / "_epoch.json").read_text())
    assert any(p["path"].endswith("/part-1045.parquet") for p in record["partitions"])
    assert _output_ids(tmp_path / "out" / day / "10") == list(range(100 * (INPUT_PARTITIONS + 1)))
