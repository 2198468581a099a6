"""Where EpochSensor puts the epoch manifest (issue 33, item 5), under ``dag.test()`` on real local Spark.

Never the input: the sensor's ``manifest_dir``, the ``[streambatch] manifest_dir`` option, or
``<output_path>/_manifests``; with none of them XCom carries a small manifest whole and a big
one fails the sensor naming those settings. The operator reads the manifest back from each
place. The same on the S3 server, poking and deferred: `test_object_store_epochs.py`.
"""

from __future__ import annotations

import glob
import json
import logging
import shutil

import pendulum
import pyarrow.parquet as pq
import pytest
from pipelines import write_inputs

LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")
CONFIG_ENV = "AIRFLOW__STREAMBATCH__MANIFEST_DIR"


def _run(dag, root) -> dict:
    dr = dag.test(logical_date=LOGICAL, run_after=LOGICAL, run_conf={"root": str(root)})
    return {ti.task_id: ti.state for ti in dr.get_task_instances()}


def _epoch(root, partitions=3):
    write_inputs(root / "in" / "2026-11-22", partitions=partitions)
    (root / "in" / "2026-11-22" / "_SUCCESS").write_text("")


def _manifests(directory) -> list[str]:
    return sorted(glob.glob(f"{directory}/**/manifest-*.json", recursive=True))


def _xcom(dag_id, task_id):
    from airflow import settings
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    with settings.Session() as session:
        row = session.scalars(select(XComModel).where(XComModel.dag_id == dag_id, XComModel.task_id == task_id,
                                                      XComModel.key == "return_value")).one()
        return XComModel.deserialize_value(row)


def _output_ids(root) -> list[int]:
    files = glob.glob(f"{root}/out/2026-11-22/p*/*.parquet")
    return sorted(i for f in files for i in pq.read_table(f)["id"].to_pylist())


def test_the_manifest_goes_to_the_option_else_beside_the_output_else_whole_into_xcom(ctx, airflow_db, tmp_path,
                                                                                     monkeypatch):
    """Three runs of one epoch: the option wins over ``output_path``; without it the manifest lands
    beside the output; a sensor told neither pushes the small manifest whole. The operator reads
    each; nothing is ever written under the input."""
    from manifest_location_test_dags import sb_manifest_beside_output, sb_manifest_unplaced

    _epoch(tmp_path)
    inputs = sorted(p.name for p in (tmp_path / "in" / "2026-11-22").iterdir())
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "manifests"))
    assert _run(sb_manifest_beside_output, tmp_path) == {"wait_for_epoch": "success", "score": "success"}
    pointer = _xcom("sb_manifest_beside_output", "wait_for_epoch")
    configured = _manifests(tmp_path / "manifests")
    assert len(configured) == 1 and pointer["manifest_uri"] == f"file://{configured[0]}"
    assert _xcom("sb_manifest_beside_output", "score")["manifest_uri"] == pointer["manifest_uri"]  # the operator's
    assert _output_ids(tmp_path) == list(range(300)) and not _manifests(tmp_path / "out")

    monkeypatch.delenv(CONFIG_ENV)
    assert _run(sb_manifest_beside_output, tmp_path) == {"wait_for_epoch": "success", "score": "success"}
    beside = _manifests(tmp_path / "out" / "2026-11-22" / "_manifests")
    pointer = _xcom("sb_manifest_beside_output", "wait_for_epoch")
    assert len(beside) == 1 and pointer["manifest_uri"] == f"file://{beside[0]}"
    assert _xcom("sb_manifest_beside_output", "score")["manifest_uri"] == pointer["manifest_uri"]
    assert json.loads((tmp_path / "out" / "2026-11-22" / "_epoch.json").read_text())["status"] == "succeeded"

    assert _run(sb_manifest_unplaced, tmp_path) == {"wait_for_epoch": "success", "score": "success"}
    whole = _xcom("sb_manifest_unplaced", "wait_for_epoch")
    assert "manifest_uri" not in whole and len(whole["partitions"]) == 3  # small: XCom carries it whole
    assert _xcom("sb_manifest_unplaced", "score")["committed"] == 3  # the operator read it
    assert sorted(p.name for p in (tmp_path / "in" / "2026-11-22").iterdir()) == inputs  # the input untouched
    assert not _manifests(tmp_path / "in")


@pytest.mark.parametrize("deferrable", [False, True])
def test_a_manifest_too_large_for_xcom_with_nowhere_to_go_fails_the_sensor_naming_the_settings(
        airflow_db, tmp_path, caplog, capfd, monkeypatch, deferrable):
    """700 files: over the bound for a whole manifest. Poking, the sensor refuses to push it; deferred
    (the marker appears just after the sensor's first look), the trigger refuses to put it in its
    event (stored in the database too). Before, the sensor wrote it under the input."""
    import manifest_location_test_dags

    from airflow_streambatch.epochs import EpochManifest, list_inputs
    from airflow_streambatch.epochs.manifest_store import MAX_WHOLE_MANIFEST_BYTES
    from airflow_streambatch.sensors import epoch as sensor_module

    epoch_in = tmp_path / "in" / "2026-11-22"
    write_inputs(epoch_in, partitions=1)
    for i in range(1, 700):
        shutil.copyfile(epoch_in / "part-000.parquet", epoch_in / f"part-{i:03d}.parquet")
    first_look = sensor_module.check_epoch

    def look_then_mark(*args):
        found = first_look(*args)
        (epoch_in / "_SUCCESS").write_text("")
        return found

    monkeypatch.setattr(sensor_module, "check_epoch", look_then_mark)
    whole = EpochManifest("a", "b", list_inputs(str(epoch_in))).to_dict()
    assert len(json.dumps(whole, separators=(",", ":"))) > MAX_WHOLE_MANIFEST_BYTES
    dag = (manifest_location_test_dags.sb_manifest_sensor_only_deferrable if deferrable
           else manifest_location_test_dags.sb_manifest_sensor_only)
    with caplog.at_level(logging.INFO):
        assert _run(dag, tmp_path) == {"wait_for_epoch": "failed"}
    logged = caplog.text + "".join(capfd.readouterr())
    assert "(700 partitions" in logged and f"over the {MAX_WHOLE_MANIFEST_BYTES} bytes" in logged
    assert "EpochSensor(manifest_dir=...), the [streambatch] manifest_dir option" in logged
    assert ("[DAG TEST] running trigger in line" in logged) is deferrable
    assert ("EpochTrigger on " in logged) is deferrable  # deferred, the trigger refused to carry it
    assert not _manifests(tmp_path)


def test_a_configured_location_that_cannot_be_written_fails_the_sensor_naming_the_option(
        airflow_db, tmp_path, caplog, capfd, monkeypatch):
    from manifest_location_test_dags import sb_manifest_sensor_only

    _epoch(tmp_path)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "a-file" / "manifests"))
    with caplog.at_level(logging.INFO):
        assert _run(sb_manifest_sensor_only, tmp_path) == {"wait_for_epoch": "failed"}
    logged = caplog.text + "".join(capfd.readouterr())
    assert "cannot write the epoch manifest under" in logged
    assert f"[streambatch] manifest_dir = '{tmp_path}/a-file/manifests' (AIRFLOW__STREAMBATCH__MANIFEST_DIR)" in logged
    assert not _manifests(tmp_path)
