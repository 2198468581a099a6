"""The epoch's metrics through Airflow's own metrics client: StatsD or OpenTelemetry, as ``[metrics]`` says.

After every run of an epoch (it succeeded, some partitions failed, it was interrupted
or stopped by an error) `epoch_metrics` sends, under the ``streambatch.`` prefix:

* counters of what this try did (summed over tries they give the epoch's totals, each
  partition counted once): partitions committed and failed, rows and bytes committed,
  rows quarantined, the engine's task retries, and the run's outcome;
* gauges of the epoch's state after this try, read from the epoch record's counts;
* a timer of the try's duration.

Each goes out through ``airflow.sdk.observability.stats``, the client Airflow's task
runner initializes from ``[metrics]`` (``statsd_on``, ``otel_on``, their hosts, prefix,
allow and block lists), so no client or address of ours is involved. Tags carry
``dag_id`` and ``task_id``; plain StatsD drops tags, so, as Airflow does for its own task
metrics (``ti.finish.<dag_id>.<task_id>.<state>``) while ``[metrics] legacy_names_on``
holds, each also goes out under a name that ends with them. Metrics never fail the task:
an error sending them is logged as a warning.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from airflow_streambatch.epochs.checkpoint import INTERRUPTIONS, EpochCheckpoint, EpochRecord
from airflow_streambatch.epochs.states import PartitionState

log = logging.getLogger("airflow_streambatch.metrics")

PREFIX = "streambatch"
OUTCOMES = ("succeeded", "failed", "interrupted", "error")  # the ``state`` of streambatch.epoch.finish

# name -> what it counts (docs/airflow.md's table lists them; tests/provider/test_metrics.py checks the names)
COUNTERS = {
    "partitions.committed": "input partitions this try committed",
    "partitions.failed": "input partitions that failed in this try (their error is in the epoch record)",
    "rows.committed": "rows of the partitions this try committed",
    "bytes.committed": "bytes of the files this try committed",
    "rows.quarantined": "rows the partitions this try committed set aside as quarantined",
    "task_retries": "engine task attempts run again (a task that raised, was preempted or lost its Spark job)",
}
GAUGES = {
    "epoch.partitions": "input partitions of the epoch (its manifest)",
    "epoch.partitions_committed": "partitions committed, by this try or an earlier one",
    "epoch.partitions_failed": "partitions whose last run failed",
    "epoch.partitions_pending": "partitions not finished (an interrupted run)",
    "epoch.rows": "rows committed, all tries",
    "epoch.bytes": "bytes committed, all tries",
    "epoch.rows_quarantined": "rows quarantined, all tries",
}


def _outcome(exc: BaseException | None) -> str:
    if exc is None:
        return "succeeded"
    if getattr(exc, "record", None) is not None:  # EpochPartitionsFailed: the epoch ran, partitions failed
        return "failed"
    return "interrupted" if type(exc).__name__ in INTERRUPTIONS else "error"


def _this_try(record: EpochRecord, started: float) -> EpochRecord | None:
    """``record`` if this try saved it (the clock of the process that saved it, at or after ``started``):
    a record of an earlier try, left when this run stopped before saving its own, would count that
    try's work again."""
    return record if record.updated_at >= started else None


def _load_record(task, started: float) -> EpochRecord | None:
    """The record the stopped run left (in_process: the engine saved it; spark_submit: its driver, or
    `deploy_modes.SparkSubmit` after it); None when there is none of this try, or it cannot be read."""
    record_dir = getattr(task, "_record_dir", None)
    if record_dir is None:  # stopped before the epoch's manifest was known
        return None
    try:
        record = EpochCheckpoint(record_dir).load()
    except Exception as exc:  # noqa: BLE001 - metrics never mask why the task stopped
        log.warning("epoch metrics: cannot read the epoch record in %s: %s", record_dir, exc)
        return None
    return _this_try(record, started) if record is not None else None


def epoch_values(record: EpochRecord | None) -> tuple[dict[str, int], dict[str, int]]:
    """(counters, gauges) of one try from its epoch record (None: no record, all counters 0, no gauges)."""
    counters = dict.fromkeys(COUNTERS, 0)
    if record is None:
        return counters, {}
    counts = record.counts()
    for p in record.partitions:
        if p.state == PartitionState.COMMITTED and p.this_try:
            counters["rows.committed"] += p.rows
            counters["bytes.committed"] += p.bytes
            counters["rows.quarantined"] += p.quarantined
    counters["partitions.committed"] = counts["committed_this_try"]
    counters["partitions.failed"] = counts["failed"]
    # the engine ran in this try; an epoch already committed returns its earlier try's record, metrics included
    if counts["committed_this_try"] or counts["failed"] or counts["pending"]:
        counters["task_retries"] = sum(op.get("tasks_retried", 0) for op in record.metrics.get("operators", []))
    gauges = {"epoch.partitions": len(record.partitions), "epoch.partitions_committed": counts["committed"],
              "epoch.partitions_failed": counts["failed"], "epoch.partitions_pending": counts["pending"],
              "epoch.rows": counts["rows"], "epoch.bytes": counts["bytes"],
              "epoch.rows_quarantined": counts["quarantined"]}
    return counters, gauges


def _legacy_names_on() -> bool:
    from airflow.sdk.configuration import conf

    return conf.getboolean("metrics", "legacy_names_on", fallback=True)


def send(outcome: str, record: EpochRecord | None, duration_s: float, *, dag_id: str, task_id: str) -> None:
    """Send one try's metrics through Airflow's stats client (a no-op client when metrics are off)."""
    from airflow.sdk.observability import stats

    tags = {"dag_id": dag_id, "task_id": task_id}
    # Airflow's legacy names: the variables in the name, '.' in them as '__' (a task in a group: "group.task")
    suffix = f"{dag_id.replace('.', '__')}.{task_id.replace('.', '__')}" if _legacy_names_on() else None

    def each(kind: str, name: str, value: Any, extra: dict | None = None) -> None:
        emit = getattr(stats, kind)
        emit(f"{PREFIX}.{name}", value, tags={**tags, **(extra or {})})
        if suffix is not None:
            emit(f"{PREFIX}.{name}.{suffix}" + "".join(f".{v}" for v in (extra or {}).values()), value)

    counters, gauges = epoch_values(record)
    each("incr", "epoch.finish", 1, {"state": outcome})
    for name, value in counters.items():
        each("incr", name, value)
    for name, value in gauges.items():
        each("gauge", name, value)
    each("timing", "epoch.duration", duration_s * 1000.0)  # milliseconds, as Airflow's task.duration


@contextlib.contextmanager
def epoch_metrics(task) -> Iterator[None]:
    """Time the operator's run of an epoch and send its metrics when it ends, however it ends. The
    record comes from ``task._epoch_record`` (set once the run has one) or, when the run stopped
    without returning it, from the epoch checkpoint under ``task._record_dir``."""
    task._epoch_record = None
    started_wall, started = time.time(), time.monotonic()
    try:
        yield
    except BaseException as exc:
        _send_safely(task, _outcome(exc), started_wall, started, exc)
        raise
    _send_safely(task, "succeeded", started_wall, started, None)


def _send_safely(task, outcome: str, started_wall: float, started: float, exc: BaseException | None) -> None:
    duration_s = time.monotonic() - started
    try:
        record = task._epoch_record or getattr(exc, "record", None)
        if record is None and outcome != "succeeded":
            record = _load_record(task, started_wall)
        send(outcome, record, duration_s, dag_id=task.dag_id, task_id=task.task_id)
    except Exception as error:  # noqa: BLE001 - the epoch's outcome is the task's, whatever metrics do
        log.warning("epoch metrics of %s.%s not sent: %s", task.dag_id, task.task_id, error)
