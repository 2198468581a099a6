"""The epoch view plugin, served by Airflow's own API app, over epochs that real runs recorded.

An epoch fails on two of its four partitions under ``dag.test()`` on real local Spark,
then runs again without the failure cause (what a Clear does); after each run the view
is fetched through `airflow.api_fastapi.app.create_app`, which mounts the plugin's
FastAPI app from its ``airflow.plugins`` entry point, with the simple auth manager's
JWTs. The browser test (test_epoch_view_browser.py) does the same through the UI.
"""

from __future__ import annotations

import html
import re
from urllib.parse import urlsplit

import pendulum
import pytest
from pipelines import take_partitions_run, write_inputs

LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")
DAY = "2026-11-22"


@pytest.fixture(scope="module")
def api(airflow_db):
    """Airflow's API app (core API and plugins) in this process, and JWTs of an admin and of a user
    without any role."""
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    app = create_app("core")
    manager = get_auth_manager()
    admin = manager.generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
    nobody = manager.generate_jwt(SimpleAuthManagerUser(username="nobody", role=None))
    with TestClient(app) as client:
        yield client, admin, nobody


def _run(dag, root, **conf):
    conf = {"root": str(root), "fail_partitions": [], "full_recompute": False, "kill_driver_on": -1, **conf}
    dr = dag.test(logical_date=LOGICAL, run_after=LOGICAL, run_conf=conf)
    return dr.run_id, {ti.task_id: ti.state for ti in dr.get_task_instances()}


def _view(client, token, run_id, task_id="score", map_index="-1"):
    return client.get(f"/streambatch/epochs/sb_epoch/{run_id}/{task_id}", params={"map_index": map_index},
                      headers={"Authorization": f"Bearer {token}"} if token else {})


def _rows(page: str, table: str) -> list[str]:
    """The text of each row of one of the page's partition tables."""
    body = re.search(rf"<table id='{table}'>(.*?)</table>", page, re.S)
    return re.findall(r"<tr class='partition[^>]*>(.*?)</tr>", body.group(1), re.S) if body else []


def test_the_view_shows_failed_partitions_then_what_the_rerun_committed(ctx, api, tmp_path):
    from streambatch_test_dags import sb_epoch

    from airflow_streambatch.operators.links import epoch_view_url

    client, admin, nobody = api
    write_inputs(tmp_path / "in" / DAY, partitions=4)
    (tmp_path / "in" / DAY / "_SUCCESS").write_text("")
    (tmp_path / "runs").mkdir()
    (tmp_path / "fail").write_text("")
    run_id, states = _run(sb_epoch, tmp_path, fail_partitions=[1, 3])
    assert states == {"wait_for_epoch": "success", "score": "failed"}
    assert sorted(set(take_partitions_run(tmp_path / "runs"))) == [0, 1, 2, 3]

    assert _view(client, None, run_id).status_code == 401  # no JWT: not authenticated
    assert _view(client, nobody, run_id).status_code == 403  # a user who may not read the DAG's task instances
    assert _view(client, admin, "no-such-run").status_code == 404
    link = urlsplit(epoch_view_url("sb_epoch", run_id, "score"))  # what the "Epoch output" link opens
    response = client.get(f"{link.path}?{link.query}", headers={"Authorization": f"Bearer {admin}"})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    failed = _rows(page, "failed-partitions")
    assert len(failed) == 2, page
    for row, index in zip(failed, (1, 3)):
        assert f"in/{DAY}/part-{index:03d}.parquet" in row
        assert f"scorer rejects partition(s) [{index}]" in html.unescape(row)
        traceback = re.search(rf"<tr class='traceback' data-index='{index}'>.*?<details><summary>traceback of "
                              rf"partition {index}</summary><pre>(.*?)</pre></details>", page, re.S)
        assert traceback and "Traceback (most recent call last)" in traceback.group(1)
        assert f"scorer rejects partition(s) [{index}]" in html.unescape(traceback.group(1))
    committed = _rows(page, "committed-partitions")
    assert len(committed) == 2 and all("100" in row and ".parquet" in row for row in committed)
    assert "2 of 4 partitions committed" in page and "Clear this task to rerun 2 partitions" in page
    assert f"file://{tmp_path}/out/{DAY}" in html.unescape(page)
    assert "<meta http-equiv=\"refresh\"" not in page  # the task is not running: no reloads

    # the UI's tab substitutes no {MAP_INDEX} on an unmapped task instance's page
    assert _view(client, admin, run_id, map_index="{MAP_INDEX}").text == page

    (tmp_path / "fail").unlink()
    run_id_again, states = _run(sb_epoch, tmp_path, fail_partitions=[1, 3])
    assert states["score"] == "success"
    assert take_partitions_run(tmp_path / "runs") == [1, 3]  # the pipeline's own log: only the failed two ran
    page = _view(client, admin, run_id_again).text
    assert _rows(page, "failed-partitions") == [] and "Clear this task" not in page
    committed = _rows(page, "committed-partitions")
    this_try = [int(re.search(r"data-index='(\d+)'", r).group(1)) for r in re.findall(
        r"<tr class='partition committed'[^>]*data-this-try='true'", page)]
    assert len(committed) == 4 and this_try == [1, 3]
    assert "4 of 4 partitions committed" in page and "(2 by this try)" in page
    assert "<table id='operators'>" in page and "rows/s" in page


def test_the_view_reads_the_operators_task_state_key():
    from airflow_streambatch.operators.streambatch import STATE_KEY
    from airflow_streambatch.plugins.epoch_data import STATE_KEY as VIEW_STATE_KEY

    assert VIEW_STATE_KEY == STATE_KEY


def test_every_value_from_user_data_is_escaped(ctx, api, tmp_path):
    """Paths, errors and tracebacks are user data: markup in them is shown, never interpreted."""
    from airflow.utils.session import create_session
    from streambatch_test_dags import sb_epoch

    from airflow_streambatch.plugins.epoch_data import gather
    from airflow_streambatch.plugins.epoch_page import render

    write_inputs(tmp_path / "in" / DAY, partitions=2)
    (tmp_path / "in" / DAY / "_SUCCESS").write_text("")
    (tmp_path / "runs").mkdir()
    (tmp_path / "fail").write_text("")
    run_id, states = _run(sb_epoch, tmp_path, fail_partitions=[0])
    assert states["score"] == "failed"
    with create_session() as session:
        view = gather(session, "sb_epoch", run_id, "score")
    hostile = "<script>alert('x')</script><img src=x onerror=alert(1)>\"'&"
    failed = view.record.by_state("failed")[0]
    failed.error, failed.traceback, failed.operator = hostile, hostile, hostile
    view.record.epoch["partitions"][0]["path"] = hostile
    view.record.reason = hostile
    page = render(view)
    assert "<script>" not in page and "<img" not in page and "onerror=alert(1)>" not in page
    assert page.count(html.escape(hostile, quote=True)) >= 4


def test_rows_set_aside_are_counted_in_the_record_the_log_and_the_view(ctx, api, tmp_path, capsys):
    """``data_context={"on_row_error": "quarantine"}``: the epoch succeeds with its good rows, and the
    three rows the scorer fails on are committed beside them, counted where an operator looks."""
    from streambatch_test_dags import sb_epoch_quarantine

    from airflow_streambatch.epochs.checkpoint import EpochCheckpoint
    from airflow_streambatch.operators.metrics import epoch_values

    client, admin, _ = api
    write_inputs(tmp_path / "in" / DAY, partitions=3)
    (tmp_path / "in" / DAY / "_SUCCESS").write_text("")
    (tmp_path / "runs").mkdir()
    run_id, states = _run(sb_epoch_quarantine, tmp_path, reject_ids=[5, 105, 150])
    assert states == {"wait_for_epoch": "success", "score": "success"}
    record = EpochCheckpoint(str(tmp_path / "out" / DAY)).load()
    assert record.counts()["quarantined"] == 3 and record.counts()["rows"] == 297
    assert [p.quarantined for p in record.partitions] == [1, 2, 0]
    counters, gauges = epoch_values(record)  # what the epoch's metrics send (test_metrics.py: how they are sent)
    assert counters["rows.quarantined"] == 3 and gauges["epoch.rows_quarantined"] == 3
    assert "3 row(s) quarantined beside them" in capsys.readouterr().out  # the task's log
    page = client.get(f"/streambatch/epochs/sb_epoch_quarantine/{run_id}/score",
                      headers={"Authorization": f"Bearer {admin}"}).text
    assert "<span id='quarantined'>3 rows quarantined</span>" in page
    assert "+2 quarantined" in _rows(page, "committed-partitions")[1]
