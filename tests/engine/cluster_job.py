"""A pipeline run against a standalone cluster, in its own process (a process holds one
SparkContext, and the test session's is local). Prints one ``RESULT {json}`` line.

    python cluster_job.py MASTER INPUT OUTPUT BLOCK_DIR MARKERS MODE [SLEEP_S] [MAX_FAILED]

MODE: ``none``, ``raise:<id>,<id>`` (the UDF always fails on those ids) or
``kill-python:<id>`` (the Python worker running that id kills itself, once).
"""

from __future__ import annotations

import json
import os
import sys
import time


def first_time(marker_dir: str, key: str) -> bool:
    """True exactly once per key across all processes (O_EXCL file creation)."""
    try:
        os.close(os.open(os.path.join(marker_dir, key), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


class FailOn:
    """Raises on the given ids: always, or only on the first attempt."""

    def __init__(self, ids, marker_dir=None):
        self.ids, self.marker_dir = set(ids), marker_dir

    def __call__(self, batch):
        for i in batch["id"].to_pylist():
            if i in self.ids and (self.marker_dir is None or first_time(self.marker_dir, str(i))):
                raise ValueError(f"poisoned row {i}")
        return batch


class Work:
    def __init__(self, mode: str, markers: str, sleep_s: float):
        self.kind, _, ids = mode.partition(":")
        self.ids = {int(i) for i in ids.split(",") if i}
        self.markers, self.sleep_s = markers, sleep_s

    def __call__(self, batch):
        time.sleep(self.sleep_s)
        for i in batch["id"].to_pylist():
            if i in self.ids and self.kind == "raise":
                raise ValueError(f"poisoned row {i}")
            if i in self.ids and self.kind == "kill-python" and first_time(self.markers, f"killed-{i}"):
                os._exit(1)
        return batch.append_column("worker_pid", batch["id"].cast("int64"))


def cluster_session(master: str, app_name: str):
    """The test cluster's SparkSession: two executors of 2 cores, this interpreter and this
    directory (the UDFs' module) on the executors; shared by the cluster driver scripts."""
    # PySpark's driver picks the executors' interpreter from this variable ("python3" if unset)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from airflow_streambatch.engine.spark.session import with_spark_defaults

    here = os.path.dirname(os.path.abspath(__file__))
    spark = (
        SparkSession.builder.master(master).appName(app_name)
        .config("spark.executor.cores", "2").config("spark.cores.max", "4").config("spark.executor.memory", "512m")
        # both executors registered before the first job: tests that assert work on both hosts
        # (CI once saw every task of a run on the one executor that registered first)
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "60s")
        .config("spark.pyspark.python", sys.executable).config("spark.executorEnv.PYTHONPATH", here)
        .config(map=with_spark_defaults({"spark.ui.enabled": "false"}))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> None:
    master, source, output, block_dir, markers, mode = sys.argv[1:7]
    sleep_s = float(sys.argv[7]) if len(sys.argv) > 7 else 0.2
    max_failed = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    spark = cluster_session(master, "streambatch-cluster-test")
    import airflow_streambatch.engine as sb

    ctx = sb.DataContext(block_dir=block_dir, max_failed_partitions=max_failed, progress_interval_s=2,
                         resources={"CPU": 4})
    partitions = len(os.listdir(source))  # one input partition per file
    ds = sb.read_parquet(source, override_num_blocks=partitions).map_batches(
        Work, fn_constructor_args=(mode, markers, sleep_s), batch_format="pyarrow")
    started = time.time()
    try:
        with ctx.scoped():
            result = ds.write_parquet(output, mode="resume")
        summary = {"committed": sorted(result.committed), "skipped": sorted(result.skipped),
                   "failed": [{"partition": f.partition, "label": f.label, "error": f.error} for f in result.failed]}
    except sb.PartitionsFailedError as exc:
        summary = {"error": str(exc), "failed": [f.partition for f in exc.failures]}
    summary["wall_s"] = time.time() - started
    print("RESULT " + json.dumps(summary), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
