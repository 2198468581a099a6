"""Run ``sb_epoch`` under ``dag.test()`` twice in this process, with OpenLineage configured by the environment.

`test_openlineage.py` starts this as its own process: the OpenLineage provider reads its
configuration and registers its listener (an Airflow plugin) when Airflow's plugins first
load, which in the test session happened long before, without OpenLineage. The first run
fails partitions 1 and 3; the second, for the same logical date, is the Clear that reruns
them. After each run this writes what the embedded Spark application was given: its
``spark.openlineage.*`` properties (the parent job). The second run reuses the first's
Spark application, as ``dag.test()`` in one process does (a worker runs each try in a
process of its own).

Usage: ``python openlineage_runs.py <root> <report.json>``
"""

from __future__ import annotations

import json
import os
import sys

import pendulum

LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")


def main(root: str, report: str) -> None:
    from pyspark import SparkContext
    from streambatch_test_dags import sb_epoch

    runs = []
    for fail in (True, False):
        if not fail:
            os.remove(os.path.join(root, "fail"))
        conf = {"root": root, "fail_partitions": [1, 3], "full_recompute": False, "kill_driver_on": -1}
        dr = sb_epoch.test(logical_date=LOGICAL, run_after=LOGICAL, run_conf=conf)
        sc = SparkContext._active_spark_context
        spark_conf = {k: v for k, v in sc.getConf().getAll() if k.startswith("spark.openlineage.")} if sc else {}
        runs.append({"states": {ti.task_id: ti.state for ti in dr.get_task_instances()},
                     "spark_openlineage": spark_conf})
    with open(report, "w") as f:
        json.dump(runs, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
