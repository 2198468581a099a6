"""The engine and the hook on a Spark Connect session (`engine/spark/connect*.py`, `hooks/spark_connect_session.py`).

End-to-end, fault and epoch tests run on both kinds of session from the same code
(`session_kinds.spark_kind`); these check what only Connect has: that its tasks really run
in the server's application, the start-up check of the control plane, and the hook's
``sc://`` and ``spark_connect`` connections.
"""

from __future__ import annotations

import json
import os

import pytest

import airflow_streambatch.engine as sb
from ports import free_port


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _worker_parent(batch):
    import os

    return {"id": batch["id"], "daemon": [os.getppid()] * len(batch["id"])}


@pytest.mark.parametrize("spark_kind", ["connect"])
def test_a_connect_session_runs_the_engine_in_the_servers_application(ctx, connect_server, connect_session):
    from airflow_streambatch.engine.spark.session import get_spark

    assert get_spark() is connect_session
    rows = sb.range(100, override_num_blocks=4).map_batches(_worker_parent).take_all()
    assert sorted(r["id"] for r in rows) == list(range(100))
    daemons = {r["daemon"] for r in rows}  # pyspark's worker daemon, a child of the server's JVM
    assert {_parent_of(d) for d in daemons} == {connect_server.pid}


def test_tasks_that_cannot_reach_the_control_plane_fail_at_start_naming_the_setting(connect_session):
    from airflow_streambatch.engine.spark.connect import ConnectSessionError, check_connect_session

    closed = free_port()  # nothing listens there
    with pytest.raises(ConnectSessionError, match=rf"cannot reach this client's control plane at 127.0.0.1:{closed}.*"
                                                  r"set SPARK_LOCAL_IP"):
        check_connect_session(connect_session, "127.0.0.1", closed, 2)


def test_a_hook_with_a_spark_connect_connection_gets_a_session_on_that_server(connect_server, monkeypatch, capsys):
    from airflow_streambatch.engine.spark.connect import is_connect
    from airflow_streambatch.hooks.streambatch import StreamBatchHook

    port = connect_server.url.rsplit(":", 1)[1]
    monkeypatch.setenv("AIRFLOW_CONN_SB_CONNECT", json.dumps({
        "conn_type": "spark_connect", "host": "127.0.0.1", "port": int(port), "password": "s3cr3t-token"}))
    monkeypatch.setenv("AIRFLOW_CONN_SB_SC", json.dumps({"conn_type": "spark", "host": f"sc://127.0.0.1:{port}"}))
    assert StreamBatchHook("sb_connect").connect_url.startswith(f"sc://127.0.0.1:{port}/;token=")
    assert StreamBatchHook("sb_sc").connect_url == f"sc://127.0.0.1:{port}"

    session = StreamBatchHook("sb_sc", spark_conf={"spark.sql.shuffle.partitions": "7"}).get_spark_session()
    try:
        assert is_connect(session) and session.conf.get("spark.sql.shuffle.partitions") == "7"
        logged = capsys.readouterr().out  # Airflow's task logging writes to stdout
        assert f"Connecting to the Spark Connect server at 127.0.0.1:{port}" in logged
        with pytest.raises(ValueError, match=r"spark_conf\['spark.executor.memory'\] = '3g'.*a client can set only "
                                             "runtime ones"):
            StreamBatchHook("sb_sc", spark_conf={"spark.executor.memory": "3g"}).get_spark_session()
    finally:
        session.stop()
    assert "s3cr3t-token" not in logged + capsys.readouterr().out


def test_the_connect_backend_restores_a_workers_environment_after_its_tasks(ctx, connect_session):
    """Credentials a hook gives a Connect session's tasks are theirs only: the Python worker serves others next."""
    from airflow_streambatch.engine.spark.connect import worker_environment

    worker_environment(connect_session)["STREAMBATCH_TEST_SECRET"] = "only-for-this-run"
    try:
        seen = sb.range(8, override_num_blocks=2).map_batches(_secret).take_all()
    finally:
        worker_environment(connect_session).clear()
    assert {r["secret"] for r in seen} == {"only-for-this-run"}
    after = connect_session.range(0, 4, 1, 4).mapInPandas(_secret_frames, "secret string").collect()
    assert {r.secret for r in after} == {"unset"}


def _secret(batch):
    return {"id": batch["id"], "secret": [os.environ.get("STREAMBATCH_TEST_SECRET", "unset")] * len(batch["id"])}


def _secret_frames(frames):
    import pandas as pd

    for _ in frames:
        yield pd.DataFrame({"secret": [os.environ.get("STREAMBATCH_TEST_SECRET", "unset")]})
