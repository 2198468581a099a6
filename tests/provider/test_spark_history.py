"""A Spark UI that outlives the task: the event log is written where configured (a private directory),
and the link's history page resolves to the application on a real Spark History Server."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
import urllib.request

from standalone_cluster import free_port

VENV_BIN = os.path.dirname(sys.executable)  # pip puts spark-class next to the interpreter

APP = """
import json
from airflow_streambatch.hooks.streambatch import StreamBatchHook

spark = StreamBatchHook(None, app_name="history-app").get_spark_session()
assert spark.range(1000).selectExpr("sum(id)").first()[0] == 499500
app_id = spark.sparkContext.applicationId
spark.stop()
print("APP " + app_id)
"""


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except OSError as exc:
        return getattr(exc, "code", 0) or 0, str(exc)


def test_the_event_log_feeds_a_history_server_and_the_link_resolves_to_the_application(tmp_path):
    from airflow_streambatch.engine.spark.java import ensure_java
    from airflow_streambatch.operators.links import history_page

    events = tmp_path / "spark-events"  # not there yet: the hook creates it, private
    env = {**os.environ, "AIRFLOW__STREAMBATCH__SPARK_EVENT_LOG_DIR": str(events)}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run([sys.executable, "-c", APP], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    app_id = next(line for line in done.stdout.splitlines() if line.startswith("APP "))[4:]
    assert stat.S_IMODE(os.stat(events).st_mode) == 0o700
    assert [name for name in os.listdir(events) if app_id in name], os.listdir(events)  # eventlog_v2_<app>/

    ensure_java()
    port = free_port()
    history_env = {**os.environ, "SPARK_HISTORY_OPTS": f"-Dspark.history.fs.logDirectory=file://{events} "
                                                       f"-Dspark.history.ui.port={port} "
                                                       "-Dspark.history.fs.update.interval=1s"}
    log_path = tmp_path / "history.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen([os.path.join(VENV_BIN, "spark-class"),
                                   "org.apache.spark.deploy.history.HistoryServer"],
                                  env=history_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            status, body = _get(f"{base}/api/v1/applications/{app_id}")
            if status == 200:
                break
            assert server.poll() is None, f"the history server exited:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {app_id} after 180 s ({status}):\n{log_path.read_text()[-3000:]}"
            time.sleep(1)
        assert json.loads(body)["name"] == "history-app"
        status, page = _get(history_page(base + "/", app_id))
        assert status == 200 and "history-app" in page
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
