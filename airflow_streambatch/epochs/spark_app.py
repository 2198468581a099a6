"""The spark-submit application: run one epoch from a JSON spec, as the operator would in-process.

    spark-submit --master spark://host:7077 .../airflow_streambatch/epochs/spark_app.py spec.json

The spec is an `epochs.job.EpochJob` as `EpochJob.to_spec` writes it, and `EpochJob.from_spec`
rebuilds the same job here, so this driver runs exactly what the operator would have run
in-process, with the defaults declared once, on the job: the pipeline (``module:function``,
or a ``@task.streambatch`` function pickled by value: `pipeline_by_value`), the output path
and formats, the read's ``columns`` and ``row_filter`` (a pyarrow expression as
`read_pruning.encode_filter` text: the spec is a 0600 file, never a command line), and the
manifest: a pointer to the durable manifest the sensor wrote (its URI and fingerprint, read
back and checked here), or the whole manifest when there is no such file. The
outcome is the durable epoch record the run writes next to the output
(``<output>/_epoch.json``), which the operator reads back after spark-submit exits;
the exit status is non-zero only when the run itself broke (not for failed partitions,
which the record lists).

SIGTERM (the operator's ``on_kill``, a cluster manager stopping the driver) raises
`SystemExit` in the driver, so the run stops like any error does: the engine cancels
its jobs and removes its staging and blocks, and the record says the epoch failed
because it was terminated, instead of ``running`` forever.
"""

from __future__ import annotations

import json
import logging
import signal
import sys

from pyspark import SparkConf
from pyspark.sql import SparkSession

from airflow_streambatch.engine.spark.session import SPARK_DEFAULTS
from airflow_streambatch.epochs.job import EpochJob
from airflow_streambatch.epochs.runner import run_job


def _exit_on_sigterm(signum, frame):
    raise SystemExit(f"received {signal.Signals(signum).name}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: spark_app.py SPEC.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(argv[0]) as f:
        job = EpochJob.from_spec(json.load(f))
    # spark-submit passed the master and conf (the hook's properties file carries SPARK_DEFAULTS under the
    # connection's settings); defaults it lacks (a hand-made spark-submit) are added, what it set wins.
    # The engine picks up this active session.
    submitted = SparkConf()
    builder = SparkSession.builder.appName(job.app_name)
    for key, value in SPARK_DEFAULTS.items():
        if not submitted.contains(key):
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        record = run_job(job, spark_ui_url=spark.sparkContext.uiWebUrl)
        print(json.dumps(record.summary()))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
