"""The spark-submit application: run one epoch from a JSON spec, as the operator would in-process.

    spark-submit --master spark://host:7077 .../airflow_streambatch/epochs/spark_app.py spec.json

The spec holds the manifest, the pipeline (``module:function``), the output path and
formats. The outcome is the durable epoch record the run writes next to the output
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
from airflow_streambatch.epochs.manifest import EpochManifest
from airflow_streambatch.epochs.runner import run_epoch


def spec_for(manifest: EpochManifest, pipeline: str, **options) -> dict:
    """The JSON spec that `main` runs (the operator writes it to a file for spark-submit)."""
    return {"manifest": manifest.to_dict(), "pipeline": pipeline, **options}


def _exit_on_sigterm(signum, frame):
    raise SystemExit(f"received {signal.Signals(signum).name}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: spark_app.py SPEC.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with open(argv[0]) as f:
        spec = json.load(f)
    # spark-submit passed the master and conf (the hook's properties file carries SPARK_DEFAULTS under the
    # connection's settings); defaults it lacks (a hand-made spark-submit) are added, what it set wins.
    # The engine picks up this active session.
    submitted = SparkConf()
    builder = SparkSession.builder.appName(spec.get("app_name", "airflow-streambatch"))
    for key, value in SPARK_DEFAULTS.items():
        if not submitted.contains(key):
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        record = run_epoch(
            EpochManifest.from_dict(spec["manifest"]), spec["pipeline"], output_path=spec["output_path"],
            input_format=spec.get("input_format", "parquet"), output_format=spec.get("output_format", "parquet"),
            pipeline_kwargs=spec.get("pipeline_kwargs"), full_recompute=spec.get("full_recompute", False),
            context_overrides=spec.get("context_overrides"), spark_ui_url=spark.sparkContext.uiWebUrl,
        )
        print(json.dumps(record.summary()))
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
