"""Airflow's provider conventions, as Airflow itself reads them (the Apache Spark and Databricks providers do
the same): the connection form from provider info, ``[operators] default_deferrable``, links recorded with
``persist`` and read back, and ``on_kill`` stopping a real spark-submit run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

import pendulum
import psutil
from interrupt_pipelines import tasks_started
from pipelines import write_inputs

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")


def test_the_connection_form_comes_from_provider_info_as_airflow_reads_it():
    from airflow.providers_manager import ProvidersManager

    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    form = ProvidersManager().field_behaviours["streambatch"]
    assert form["hidden_fields"] == ["schema", "login", "password"]
    assert form["relabeling"]["host"] == "Master"
    assert "spark://" in form["placeholders"]["host"]
    assert json.loads(form["placeholders"]["extra"])["conf"] == {"spark.executor.memory": "4g"}
    # Airflow >= 3.2 warns about the hook method (and once read "hidden-fields" from it, which it ignores)
    assert "get_ui_field_behaviour" not in StreamBatchHook.__dict__
    assert ProvidersManager().hooks["streambatch"].hook_name == "Streaming batch on Spark"


def test_provider_info_validates_against_airflows_schema_and_registers_task_streambatch():
    """The schema Airflow's ProvidersManager validates every provider's info with (it skips a provider whose
    info does not validate), and the TaskFlow decorator it registers from ``task-decorators``."""
    from airflow.providers_manager import _create_provider_info_schema_validator
    from airflow.sdk import task

    from airflow_streambatch.decorators.streambatch import streambatch_task
    from airflow_streambatch.get_provider_info import get_provider_info

    info = get_provider_info()
    _create_provider_info_schema_validator().validate(info)  # raises jsonschema.ValidationError
    assert info["task-decorators"] == [{"class-name": "airflow_streambatch.decorators.streambatch.streambatch_task",
                                        "name": "streambatch"}]
    assert task.streambatch is streambatch_task


def test_the_sensor_defaults_to_operators_default_deferrable():
    from airflow_streambatch.sensors.epoch import EpochSensor

    assert EpochSensor(task_id="w", input_path="/in").deferrable is False  # Airflow's default: false
    script = ("from airflow_streambatch.sensors.epoch import EpochSensor\n"
              "print(EpochSensor(task_id='w', input_path='/in').deferrable,"
              " EpochSensor(task_id='v', input_path='/in', deferrable=False).deferrable)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "true"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "True False"  # the setting is the default, not an override


def test_epoch_view_url_quotes_the_ids_under_the_api_base_url(monkeypatch):
    from airflow_streambatch.operators.links import epoch_view_url

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/team/")
    assert (epoch_view_url("my dag", "manual__2026-11-22T10:00:00+00:00", "a/b", 3)
            == "https://airflow.example.com/team/streambatch/epochs/my%20dag/"
               "manual__2026-11-22T10%3A00%3A00%2B00%3A00/a%2Fb?map_index=3")
    monkeypatch.delenv("AIRFLOW__API__BASE_URL")
    assert epoch_view_url("d", "r", "t").startswith("http://localhost:8080/streambatch/epochs/d/r/t?map_index=-1")


def test_links_are_persisted_by_the_operator_and_read_back_as_the_ui_reads_them(ctx, spark, airflow_db, tmp_path,
                                                                                 monkeypatch):
    from airflow import settings
    from airflow.models.xcom import XComModel
    from sqlalchemy import select
    from streambatch_test_dags import sb_epoch

    from airflow_streambatch.operators.links import EpochOutputLink, SparkUILink, history_page

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.com/")
    monkeypatch.setenv("AIRFLOW__STREAMBATCH__SPARK_HISTORY_SERVER_URL", "http://history.example.com:18080/")
    epoch_in = tmp_path / "in" / "2026-11-22"
    write_inputs(epoch_in, partitions=2)
    (epoch_in / "_SUCCESS").write_text("")
    (tmp_path / "runs").mkdir()
    conf = {"root": str(tmp_path), "fail_partitions": [], "full_recompute": False, "kill_driver_on": -1}
    dr = sb_epoch.test(logical_date=LOGICAL, run_after=LOGICAL, run_conf=conf)
    assert {ti.task_id: ti.state for ti in dr.get_task_instances()}["score"] == "success"

    with settings.Session() as session:
        rows = session.scalars(select(XComModel).where(XComModel.dag_id == "sb_epoch", XComModel.task_id == "score",
                                                       XComModel.run_id == dr.run_id)).all()
        xcoms = {row.key: XComModel.deserialize_value(row) for row in rows}
    # what persist() recorded, and what Airflow stored from get_link() when the try ended: the UI reads the latter
    assert xcoms[EpochOutputLink.output_key] == f"file://{tmp_path}/out/2026-11-22"
    quoted_run = dr.run_id.replace(":", "%3A").replace("+", "%2B")
    assert xcoms[EpochOutputLink.xcom_key] == (f"https://airflow.example.com/streambatch/epochs/sb_epoch/{quoted_run}"
                                               "/score?map_index=-1")
    # the live UI dies with the task: once the try ended, the link is the application's history page
    page = history_page("http://history.example.com:18080", spark.sparkContext.applicationId)
    assert page == f"http://history.example.com:18080/history/{spark.sparkContext.applicationId}/jobs/"
    assert xcoms[SparkUILink.history_key] == page and xcoms[SparkUILink.xcom_key] == page

    monkeypatch.delenv("AIRFLOW__STREAMBATCH__SPARK_HISTORY_SERVER_URL")
    dr = sb_epoch.test(logical_date=LOGICAL, run_after=LOGICAL, run_conf=conf)
    with settings.Session() as session:
        row = session.scalars(select(XComModel).where(XComModel.dag_id == "sb_epoch", XComModel.task_id == "score",
                                                      XComModel.run_id == dr.run_id,
                                                      XComModel.key == SparkUILink.xcom_key)).one()
    assert XComModel.deserialize_value(row) == ""  # no history server, and this session runs without its UI


def _record_status(out) -> str | None:
    path = os.path.join(out, "_epoch.json")
    return json.load(open(path))["status"] if os.path.exists(path) else None


def test_on_kill_stops_a_spark_submit_run_and_its_driver(airflow_db, tmp_path, monkeypatch):
    from airflow_streambatch.epochs import EpochManifest, list_inputs, spark_app
    from airflow_streambatch.epochs.job import EpochJob
    from airflow_streambatch.operators.streambatch import StreamBatchOperator

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", '{"conn_type": "spark", "host": "local[2]"}')
    write_inputs(tmp_path / "in", partitions=2)
    end = datetime(2026, 11, 22, 11, tzinfo=timezone.utc).isoformat()
    manifest = EpochManifest("2026-11-22T10:00:00+00:00", end, list_inputs(str(tmp_path / "in")))
    started, out = tmp_path / "started", str(tmp_path / "out")
    op = StreamBatchOperator(task_id="sleepy", pipeline="interrupt_pipelines:sleepy", output_path=out,
                             deploy_mode="spark_submit", streambatch_conn_id="spark_local")
    spec = EpochJob(pipeline="interrupt_pipelines:sleepy", manifest=manifest, output_path=out,
                    pipeline_kwargs={"started_dir": str(started)},
                    data_context={"block_dir": str(tmp_path / "blocks"), "progress_interval_s": 0}).to_spec()
    outcome: list[BaseException | None] = []

    def submit():
        try:
            op.hook.submit_epoch(spec, python_path=[HERE])
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - the killed application's error is the expected outcome
            outcome.append(exc)

    thread = threading.Thread(target=submit, daemon=True)
    thread.start()
    deadline = time.monotonic() + 240
    while tasks_started(started) < 1 or not (started / "driver.pid").exists():
        assert thread.is_alive(), f"spark-submit ended before its epoch's tasks started: {outcome}"
        assert time.monotonic() < deadline, "spark-submit's epoch did not start its tasks within 240 s"
        time.sleep(0.5)
    driver = psutil.Process(int((started / "driver.pid").read_text()))
    app = os.path.abspath(spark_app.__file__)  # not this session's own JVM, a SparkSubmit too
    submit_jvm = next(p for p in psutil.Process().children(recursive=True)
                      if "org.apache.spark.deploy.SparkSubmit" in p.cmdline() and app in p.cmdline())
    application = [submit_jvm, *submit_jvm.children(recursive=True)]  # the driver, Spark's Python workers
    assert driver in application

    killed_at = time.monotonic()
    op.on_kill()
    gone, alive = psutil.wait_procs(application, timeout=30)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"still running 30 s after on_kill: {[(p.pid, p.cmdline()[:3]) for p in alive]}"
    assert time.monotonic() - killed_at < 40  # the UDFs sleep 120 s: their application was stopped
    thread.join(timeout=30)
    assert not thread.is_alive() and outcome  # the submit returned (or raised) once its application ended
    assert _record_status(out) == "failed"  # the driver, told by SIGTERM, recorded why it stopped
