"""A successful run's task log says what matters, at the level it matters.

The run is a real ``dag.test()`` in a fresh process, so Spark's driver JVM starts inside
the task, as on an Airflow worker (this test session's own JVM would hide the start-up).
On a worker, Airflow's supervisor logs whatever the task process writes to stderr at
ERROR, so the JVM's notices (log4j warnings, "Using Spark's default log4j profile", the
JVM's "WARNING: Using incubator modules") must not reach stderr: each is logged at its
own level instead. ``dag.test()`` prints the task's log records on stdout, with their
levels, which is what this test reads.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pendulum
from pipelines import write_inputs

LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")
# what the JVM and Spark write at start-up, and py4j's own logger
JVM_OUTPUT = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|INFO|ERROR)|^WARNING: |Using Spark's default log4j|"
                        r"Setting default log level|sc\.setLogLevel|py4j", re.MULTILINE)
LEVEL = re.compile(r"^\S+Z \[(\w+)\s*\]", re.MULTILINE)  # structlog's console lines: "<time> [warning  ] ..."


def test_a_successful_run_logs_no_error_and_says_when_spark_starts_and_what_committed(airflow_db, tmp_path):
    root = tmp_path / "root"
    write_inputs(root / "in" / "2026-11-22", partitions=3)
    (root / "in" / "2026-11-22" / "_SUCCESS").write_text("")
    (root / "runs").mkdir()
    script = (
        "import pendulum\n"
        "from streambatch_test_dags import sb_epoch\n"
        f"when = pendulum.parse({LOGICAL.isoformat()!r})\n"
        f"conf = {{'root': {str(root)!r}, 'fail_partitions': [], 'full_recompute': False, 'kill_driver_on': -1}}\n"
        "dr = sb_epoch.test(logical_date=when, run_after=when, run_conf=conf)\n"
        "print('TASK STATES', {ti.task_id: str(ti.state) for ti in dr.get_task_instances()})\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.environ["AIRFLOW__CORE__DAGS_FOLDER"],
                                                          os.environ["PYTHONPATH"]])}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=400,
                          cwd=tmp_path)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, err[-4000:]
    assert "TASK STATES {'score': 'success', 'wait_for_epoch': 'success'}" in out, out[-4000:]

    # nothing of the JVM's on stderr, where a worker's supervisor would have made each line an ERROR
    assert not JVM_OUTPUT.search(err), err[-4000:]
    levels = LEVEL.findall(out)
    assert levels and "error" not in levels and "critical" not in levels, [
        line for line in out.splitlines() if "[error" in line or "[critical" in line]
    # ... but at their own level in the log: a warning is a warning
    assert re.search(r"\[warning\s*\] NativeCodeLoader: Unable to load native-hadoop", out), out[-6000:]
    assert re.search(r"\[info\s*\] Using Spark's default log4j profile", out), out[-6000:]
    # the task says when Spark starts and when it is up, and how far the epoch got
    starting = out.index("Starting Spark: application streambatch-sb_epoch-score")
    up = out.index("Spark is up after")
    assert starting < up < out.index("1 of 3 partitions committed") < out.index("3 of 3 partitions committed")
