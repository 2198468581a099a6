from test_object_store_credentials import s3_with_auth, _run_watched, _reports  # noqa: F401


def test_without_connection_it_fails(ctx, spark, airflow_db, s3_with_auth, tmp_path, capfd):
    from streambatch_test_dags import sb_store_in_process
    task = sb_store_in_process.get_task("score")
    task.storage_conn_id = None
    try:
        states, _ = _run_watched(sb_store_in_process, s3_with_auth, tmp_path)
    finally:
        task.storage_conn_id = "sb_s3"
    out = "".join(capfd.readouterr())
    print("STATES", states)
    import re
    print("\n".join(l for l in out.splitlines() if re.search("(?i)access ?key|denied|forbidden", l))[:3000])
    assert states == {"score": "failed"}
