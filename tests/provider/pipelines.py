"""Pipelines the provider tests run (importable by module name on Spark's Python workers).

Input partition ``i`` holds ids ``100*i .. 100*i + 99``; each map task appends the
partitions it saw to a log under ``runs_dir``, so a test can tell which partitions ran.
A partition listed in ``fail_partitions`` raises while ``fail_flag`` exists; the
partition ``kill_driver_on`` SIGKILLs the driver (the Airflow task process) once.
`record_environment` records the AWS keys the driver and each Python worker held.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
import uuid
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def write_inputs(directory, partitions: int, rows: int = 100) -> None:
    os.makedirs(directory, exist_ok=True)
    for i in range(partitions):
        ids = list(range(100 * i, 100 * i + rows))
        pq.write_table(pa.table({"id": ids, "text": [f"row {n}" for n in ids]}), f"{directory}/part-{i:03d}.parquet")


def _score(batch: pa.Table, runs_dir: str, fail_flag: str | None, fail_partitions: list[int], kill: int,
           driver_pid: int, reject_ids: frozenset = frozenset()) -> pa.Table:
    seen = sorted({int(i) // 100 for i in batch["id"].to_pylist()})
    with open(os.path.join(runs_dir, f"{driver_pid}-{uuid.uuid4().hex}.run"), "w") as f:
        f.write(" ".join(map(str, seen)))
    if kill in seen and fail_flag and os.path.exists(fail_flag):
        time.sleep(3)  # let the other partitions commit first
        os.remove(fail_flag)  # the retry must not kill again
        os.kill(driver_pid, signal.SIGKILL)  # the Airflow task process: the Spark driver and our scheduler
        time.sleep(60)
    if fail_flag and os.path.exists(fail_flag) and set(seen) & set(fail_partitions):
        raise ValueError(f"scorer rejects partition(s) {sorted(set(seen) & set(fail_partitions))}")
    rejected = reject_ids.intersection(batch["id"].to_pylist())
    if rejected:
        raise ValueError(f"scorer rejects id {min(rejected)}")
    return batch.append_column("score", pc.multiply(batch["id"], 2))


def score(ds, epoch, *, runs_dir: str, fail_flag: str | None = None, fail_partitions=(), kill_driver_on: int = -1,
          reject_ids=()):
    os.makedirs(runs_dir, exist_ok=True)
    return ds.map_batches(partial(_score, runs_dir=runs_dir, fail_flag=fail_flag,
                                  fail_partitions=[int(p) for p in fail_partitions], kill=int(kill_driver_on),
                                  driver_pid=os.getpid(), reject_ids=frozenset(int(i) for i in reject_ids)),
                          batch_format="pyarrow")


def take_partitions_run(runs_dir) -> list[int]:
    """Partitions processed since the last call, and forget them (each test step sees its own)."""
    seen = partitions_run(runs_dir)
    for name in os.listdir(runs_dir):
        os.remove(os.path.join(runs_dir, name))
    return seen


def partitions_run(runs_dir: str, by_driver: bool = False):
    """Every partition some map task processed, with repeats, sorted (per driver pid if ``by_driver``)."""
    seen: dict[int, list[int]] = {}
    for name in os.listdir(runs_dir):
        with open(os.path.join(runs_dir, name)) as f:
            seen.setdefault(int(name.split("-")[0]), []).extend(int(p) for p in f.read().split())
    if by_driver:
        return {pid: sorted(parts) for pid, parts in seen.items()}
    return sorted(p for parts in seen.values() for p in parts)


def record_environment(ds, epoch, *, report_dir: str):
    """A pipeline that records what the driver and each Python worker see of the AWS environment
    (`environment_reports`), and scores as `score` does."""
    os.makedirs(report_dir, exist_ok=True)
    _report_environment(report_dir, "driver")
    return ds.map_batches(partial(_score_and_report, report_dir=report_dir), batch_format="pyarrow")


def _score_and_report(batch: pa.Table, report_dir: str) -> pa.Table:
    _report_environment(report_dir, "worker")
    return batch.append_column("score", pc.multiply(batch["id"], 2))


def _report_environment(report_dir: str, where: str) -> None:
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
    entry = {"where": where, "pid": os.getpid(), "key_id": os.environ.get("AWS_ACCESS_KEY_ID"),
             "secret_sha256": hashlib.sha256(secret.encode()).hexdigest()}
    with open(os.path.join(report_dir, f"{where}-{os.getpid()}-{uuid.uuid4().hex}.json"), "w") as f:
        json.dump(entry, f)


def environment_reports(report_dir) -> list[dict]:
    """What `record_environment` recorded: {where: driver or worker, pid, key_id, secret_sha256} each."""
    reports = []
    for name in sorted(os.listdir(report_dir)):
        with open(os.path.join(report_dir, name), encoding="utf-8") as f:
            reports.append(json.load(f))
    return reports


def not_a_dataset(ds, epoch):
    return [1, 2, 3]
