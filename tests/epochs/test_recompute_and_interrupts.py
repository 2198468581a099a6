"""full_recompute deletes only the epoch's own output; an interrupted epoch says so and leaves nothing behind.

Interruptions are the real ones: Airflow's execution_timeout (its SIGALRM timer raising
AirflowTaskTimeout) under ``dag.test()``, and SIGTERM sent to a process running an epoch
(``dag.test()`` in a subprocess, where Airflow's task runner calls the operator's
``on_kill``; and the spark-submit application ``spark_app.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import pendulum
import psutil
import pytest
from interrupt_pipelines import tasks_started
from pipelines import write_inputs

from airflow_streambatch.epochs import EpochCheckpoint, EpochManifest, list_inputs, run_epoch
from airflow_streambatch.epochs import spark_app
from airflow_streambatch.epochs.job import EpochJob

END = datetime(2026, 11, 22, 11, tzinfo=timezone.utc)
LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")


def _manifest(directory, partitions=2) -> EpochManifest:
    write_inputs(directory, partitions=partitions)
    return EpochManifest("2026-11-22T10:00:00+00:00", END.isoformat(), list_inputs(str(directory)))


def _identity(ds, epoch):
    return ds


# -- B: full_recompute and overlapping paths ---------------------------------------------
def test_full_recompute_deletes_only_this_epochs_output_under_a_shared_root(ctx, tmp_path):
    root = tmp_path / "out"
    other_epoch = root / "2026-11-21"
    other_epoch.mkdir(parents=True)
    write_inputs(other_epoch, partitions=1)
    (root / "README.txt").write_text("kept by the team")
    manifest = _manifest(tmp_path / "in")

    assert run_epoch(manifest, _identity, output_path=str(root)).status == "succeeded"
    record = run_epoch(manifest, _identity, output_path=str(root), full_recompute=True)
    assert record.status == "succeeded" and record.tries == 1 and record.summary()["rows"] == 200
    assert (root / "README.txt").read_text() == "kept by the team"
    assert sorted(os.listdir(other_epoch)) == ["part-000.parquet"]
    assert sorted(n for n in os.listdir(root) if n.startswith("p0")) == ["p00000", "p00001"]


def test_an_output_inside_the_input_directory_is_refused_before_anything_is_deleted(ctx, tmp_path):
    manifest = _manifest(tmp_path / "in")
    out = tmp_path / "in" / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ValueError) as info:
        run_epoch(manifest, _identity, output_path=str(out), full_recompute=True)
    assert f"'{out}' lies inside input path '{tmp_path / 'in'}'" in str(info.value)
    assert "output_path" in str(info.value)
    assert (out / "keep.txt").exists() and len(list_inputs(str(tmp_path / "in"))) == 3


def test_inputs_inside_the_output_directory_are_refused_before_anything_is_deleted(ctx, tmp_path):
    manifest = _manifest(tmp_path / "data" / "in")
    with pytest.raises(ValueError) as info:
        run_epoch(manifest, _identity, output_path=str(tmp_path / "data"), full_recompute=True)
    assert f"'{tmp_path / 'data'}' contains input path" in str(info.value)
    assert [p.path for p in list_inputs(str(tmp_path / "data" / "in"))] == manifest.paths


# -- E: interruptions ------------------------------------------------------------------------
def _assert_cleaned_up_and_failed(root, reason: str) -> dict:
    record = json.loads((root / "out" / "_epoch.json").read_text())
    assert record["status"] == "failed", record
    assert reason in record["reason"], record["reason"]
    staging = root / "out" / "_staging"
    assert not staging.exists() or os.listdir(staging) == [], os.listdir(staging)
    blocks = root / "blocks"
    assert not blocks.exists() or not [n for n in os.listdir(blocks) if n.startswith("run-")], os.listdir(blocks)
    return record


def test_an_airflow_execution_timeout_records_the_epoch_failed_and_cleans_up(ctx, airflow_db, tmp_path):
    from interrupt_test_dags import sb_timeout

    write_inputs(tmp_path / "in", partitions=2)
    started = time.monotonic()
    dr = sb_timeout.test(logical_date=LOGICAL, run_after=LOGICAL, run_conf={"root": str(tmp_path)})
    elapsed = time.monotonic() - started
    assert {ti.task_id: ti.state for ti in dr.get_task_instances()} == {"sleepy": "failed"}
    assert tasks_started(tmp_path / "started") >= 1  # it was interrupted while Spark tasks ran
    assert elapsed < 60  # the UDFs sleep 120 s: their jobs were cancelled
    record = _assert_cleaned_up_and_failed(tmp_path, "interrupted: timeout")
    assert "AirflowTaskTimeout" in record["reason"]
    assert [p["state"] for p in record["partitions"]] == ["pending", "pending"]


def test_an_execution_timeout_in_spark_submit_mode_stops_the_application_and_says_why(ctx, airflow_db, tmp_path,
                                                                                     monkeypatch):
    from interrupt_test_dags import sb_timeout_spark_submit

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", '{"conn_type": "spark", "host": "local[2]"}')
    write_inputs(tmp_path / "in", partitions=2)
    dr = sb_timeout_spark_submit.test(logical_date=LOGICAL, run_after=LOGICAL, run_conf={"root": str(tmp_path)})
    assert {ti.task_id: ti.state for ti in dr.get_task_instances()} == {"sleepy": "failed"}
    assert tasks_started(tmp_path / "started") >= 1, "spark-submit had not started the epoch's tasks yet"
    driver = int((tmp_path / "started" / "driver.pid").read_text())
    assert not psutil.pid_exists(driver) or psutil.Process(driver).status() == psutil.STATUS_ZOMBIE
    record = _assert_cleaned_up_and_failed(tmp_path, "interrupted: timeout")
    assert "the spark-submit driver: interrupted: terminated" in record["reason"]  # it cleaned up itself


def _start(args: list[str], log_path, env=None) -> subprocess.Popen:
    """A process whose output goes to a file (a pipe nobody reads would block it)."""
    with open(log_path, "w") as log:
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_for(predicate, timeout_s: float, proc: subprocess.Popen, log_path) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the process exited ({proc.returncode}) before its epoch started:\n"
                        f"{log_path.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the epoch's Spark tasks did not start in time")
        time.sleep(0.2)


def _terminate(proc: subprocess.Popen, pid: int, log_path) -> str:
    """SIGTERM ``pid``; the process must then end by itself within 30 s."""
    proc.sigterm_at = time.time()
    os.kill(pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"SIGTERM did not stop the epoch within 30 s:\n{log_path.read_text()[-4000:]}")
    return log_path.read_text()


def test_sigterm_to_an_airflow_task_process_records_the_epoch_failed_and_cleans_up(airflow_db, tmp_path):
    """Airflow's task runner calls on_kill on SIGTERM (mark failed, a stopped worker); SIGKILL follows 5 s later."""
    write_inputs(tmp_path / "in", partitions=2)
    script = (
        "import pendulum\n"
        "from interrupt_test_dags import sb_sigterm\n"
        f"dr = sb_sigterm.test(logical_date=pendulum.parse({LOGICAL.isoformat()!r}), "
        f"run_after=pendulum.parse({LOGICAL.isoformat()!r}), run_conf={{'root': {str(tmp_path)!r}}})\n"
        "print('TASK STATES', {ti.task_id: str(ti.state) for ti in dr.get_task_instances()})\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.environ["AIRFLOW__CORE__DAGS_FOLDER"],
                                                          os.environ["PYTHONPATH"]])}
    log_path = tmp_path / "task.log"
    proc = _start([sys.executable, "-c", script], log_path, env)
    _wait_for(lambda: tasks_started(tmp_path / "started") >= 2, 120, proc, log_path)  # both partitions
    out = _terminate(proc, proc.pid, log_path)
    assert "TASK STATES {'sleepy': 'failed'}" in out, out[-4000:]
    record = _assert_cleaned_up_and_failed(tmp_path, "interrupted: terminated")
    assert "received SIGTERM" in record["reason"]
    assert record["updated_at"] - proc.sigterm_at < 3  # before Airflow's SIGKILL (5 s) and on_kill's wait (3 s)


def test_sigterm_to_the_spark_submit_application_records_the_epoch_failed_and_cleans_up(tmp_path):
    manifest = _manifest(tmp_path / "in")
    spec = EpochJob(pipeline="interrupt_pipelines:sleepy", manifest=manifest, output_path=str(tmp_path / "out"),
                    pipeline_kwargs={"started_dir": str(tmp_path / "started")},
                    data_context={"block_dir": str(tmp_path / "blocks"), "progress_interval_s": 0}).to_spec()
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    spark_submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    log_path = tmp_path / "spark-submit.log"
    proc = _start([spark_submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                   os.path.abspath(spark_app.__file__), str(tmp_path / "spec.json")], log_path,
                  {**os.environ, "PYSPARK_DRIVER_PYTHON": sys.executable})
    _wait_for(lambda: tasks_started(tmp_path / "started") >= 2, 120, proc, log_path)  # both partitions
    driver = int((tmp_path / "started" / "driver.pid").read_text())  # the Python driver, spark-submit's child
    out = _terminate(proc, driver, log_path)
    assert proc.returncode != 0, out[-4000:]
    record = _assert_cleaned_up_and_failed(tmp_path, "interrupted: terminated")
    assert "received SIGTERM" in record["reason"]
    assert record["updated_at"] - proc.sigterm_at < 3  # before Airflow's SIGKILL (5 s) and on_kill's wait (3 s)
    assert EpochCheckpoint(str(tmp_path / "out")).load().reason == record["reason"]


def test_the_try_after_a_killed_driver_says_why_its_record_still_said_running(ctx, tmp_path, caplog):
    """A SIGKILLed driver writes nothing: its record says running. The next try, holding the
    output's lease, knows that try is not running and says so as it resumes."""
    manifest, out = _manifest(tmp_path / "in"), str(tmp_path / "out")
    run_epoch(manifest, _identity, output_path=out)
    with open(os.path.join(out, "_epoch.json")) as f:
        record = json.load(f)
    record["status"] = "running"  # what a driver killed mid-run leaves
    with open(os.path.join(out, "_epoch.json"), "w") as f:
        json.dump(record, f)
    with caplog.at_level("WARNING"):
        again = run_epoch(manifest, _identity, output_path=out)
    assert again.status == "succeeded" and again.tries == 2
    assert "stopped without recording why (its record still says running): its driver was killed" in caplog.text
