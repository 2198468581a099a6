"""What the operator's task log says about an epoch: what earlier tries left, then what this try did.

The Task State Store's summary of an earlier try is read only to tell the user; the
commit records decide what reruns (`epochs.checkpoint`).
"""

from __future__ import annotations

import logging

from airflow_streambatch.epochs.checkpoint import EpochRecord
from airflow_streambatch.epochs.manifest import EpochManifest


def log_earlier_progress(log: logging.Logger, earlier: dict | None, manifest: EpochManifest, output_path: str) -> None:
    """The epoch's size, and what the Task State Store says an earlier try of it did."""
    if not earlier:
        log.info("Epoch %s..%s: %d input partition(s), manifest %s", manifest.interval_start,
                 manifest.interval_end, len(manifest.partitions), manifest.fingerprint)
        return
    committed = earlier.get("committed", 0)  # a count; a list of indexes in records of older versions
    failed = earlier.get("failed", 0)  # a count; {index: error} in records of older versions
    log.info("Epoch %s..%s: the task state store holds try %s (%s): %d partition(s) committed, %d failed; "
             "the commit records under %s decide what reruns", manifest.interval_start,
             manifest.interval_end, earlier.get("tries"), earlier.get("status"),
             committed if isinstance(committed, int) else len(committed),
             failed if isinstance(failed, int) else len(failed), output_path)


def log_outcome(log: logging.Logger, record: EpochRecord) -> None:
    """The epoch's counts after this try, then each operator's tasks, rows and time."""
    s = record.summary()
    log.info("Epoch %s..%s %s: %d/%d partition(s) committed (%d by this try), %d failed, %d rows, %d bytes "
             "in %s%s", s["interval_start"], s["interval_end"], s["status"], s["committed"], s["partitions"],
             s["committed_this_try"], s["failed"], s["rows"], s["bytes"], s["output_path"],
             f"; {s['quarantined']} row(s) quarantined beside them" if s["quarantined"] else "")
    for op in record.metrics.get("operators", []):
        rate = op["rows"] / op["wall_s"] if op["wall_s"] else 0.0
        files = f", {op['files']} file(s)" if op.get("files") else ""
        rerun = f" (+{op['tasks_rerun']} rerun)" if op.get("tasks_rerun") else ""
        log.info("  %s: %d task(s)%s, %d rows, %d bytes%s, %.1f s wall, %.1f s in tasks, %.0f rows/s",
                 op["name"], op["tasks"], rerun, op["rows"], op.get("bytes", 0), files, op["wall_s"],
                 op["task_s"], rate)
