"""What both parts of W7 share: the benchmark's sizes, the driver's Spark session on the
namespaced cluster, and the lines a driver prints for the parent to parse."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass

from benchmarks.w1_memory import W1

_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CORES_PER_WORKER = 4  # 8 Spark task slots in all, as W1's local[cpus + gpus + 2]; the machine has 2 real cores


@dataclass
class W7:
    tasks: int = 48  # W1's full size: optimum 36 s
    rows: int = 40
    load_s: float = 1.0
    row_s: float = 0.05
    batch_rows: int = 20
    batch_s: float = 0.1
    cpus: int = 4
    gpus: int = 2  # one pretend GPU per worker
    memory_limit_mib: int = 512  # W1 sweeps its memory limit; W7 runs at one of W1's points
    repeats: int = 3  # (a, b) pairs, alternated
    block_mib: int = 128
    reads: int = 3  # best of

    def w1(self) -> W1:
        return W1(tasks=self.tasks, rows=self.rows, load_s=self.load_s, row_s=self.row_s,
                  batch_rows=self.batch_rows, batch_s=self.batch_s, cpus=self.cpus, gpus=self.gpus)



def _session(spec: dict, name: str, conf: dict[str, str]):
    from pyspark.sql import SparkSession

    from airflow_streambatch.engine.spark.session import with_spark_defaults

    slots = CORES_PER_WORKER * 2
    spark = (
        SparkSession.builder.master(spec["master"]).appName(f"streambatch-w7-{name}")
        .config("spark.executor.cores", str(CORES_PER_WORKER)).config("spark.cores.max", str(slots))
        .config("spark.pyspark.python", sys.executable).config("spark.executorEnv.PYTHONPATH", _root)
        .config(map=with_spark_defaults({"spark.ui.enabled": "false", **conf}))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sc, deadline = spark.sparkContext, time.monotonic() + 120
    while sc._jsc.sc().getExecutorMemoryStatus().size() < 3:  # the driver's block manager and 2 executors
        if time.monotonic() > deadline:
            raise RuntimeError("the two executors did not register within 120 s")
        time.sleep(0.2)
    return spark



def _emit(kind: str, payload: dict) -> None:
    print(f"{kind} " + json.dumps(payload), flush=True)
