"""The bounded epoch summary that XCom and the Task State Store carry instead of the record.

The durable record (``_epoch.json``) grows with the epoch: every partition's state,
files and errors. XCom and the Task State Store live in Airflow's metadata database,
so they get counts, the first failed partitions with their errors cut short, how many
failures were left out, and URIs of the record and the manifest, where the rest is.
Its size is bounded whatever the number of partitions or failures: with
`MAX_FAILED_SHOWN` failures of `ERROR_CHARS` + `TRACEBACK_CHARS` and paths of at
most `PATH_CHARS`, under 64 KiB (tests/epochs/test_bounded_summaries.py checks it).
"""

from __future__ import annotations

from airflow_streambatch.epochs.checkpoint import EpochRecord, record_uri
from airflow_streambatch.epochs.states import PartitionState

MAX_FAILED_SHOWN = 50  # failed partitions listed by index; the rest are counted in failed_left_out
ERROR_CHARS = 300  # head of each error message
TRACEBACK_CHARS = 400  # tail of each traceback (XCom only; the record keeps 4,000 characters)
PATH_CHARS = 300  # tail of each input path


def _tail(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return "..." + text[-(limit - 3):]


def _head(text: str | None, limit: int) -> str | None:
    if text is None or len(text) <= limit:
        return text
    return text[:limit - 3] + "..."


def failed_partitions(record: EpochRecord, tracebacks: bool = True) -> list[dict]:
    """The first `MAX_FAILED_SHOWN` failed partitions, each with its error (and traceback tail) cut short."""
    shown = []
    for p in record.partitions:
        if p.state != PartitionState.FAILED:
            continue
        if len(shown) == MAX_FAILED_SHOWN:
            break
        entry = {"index": p.index, "path": _tail(p.path, PATH_CHARS), "operator": p.operator,
                 "error": _head(p.error, ERROR_CHARS)}
        if tracebacks:
            entry["traceback"] = _tail(p.traceback, TRACEBACK_CHARS)
        shown.append(entry)
    return shown


def epoch_summary(record: EpochRecord, *, manifest_uri: str | None = None, tracebacks: bool = True) -> dict:
    """Counts, the first failures and the pointers: what the operator pushes to XCom (``tracebacks=False``:
    what it keeps in the Task State Store, which the UI shows at every poll). ``manifest_uri``: where the
    sensor wrote the manifest; without one, the record's URI (the record holds its manifest as ``epoch``)."""
    counts = record.counts()
    failed = failed_partitions(record, tracebacks)
    where = record_uri(record.output_path)
    return {
        "interval_start": record.epoch["interval_start"], "interval_end": record.epoch["interval_end"],
        "fingerprint": record.fingerprint, "status": str(record.status), "reason": _head(record.reason, 2000),
        "tries": record.tries, "output_path": record.output_path, "table": record.table,
        "record_uri": where, "manifest_uri": manifest_uri or where,
        "partitions": len(record.partitions), "committed": counts["committed"],
        "committed_this_try": counts["committed_this_try"], "failed": counts["failed"],
        "pending": counts["pending"], "rows": counts["rows"], "bytes": counts["bytes"],
        "quarantined": counts["quarantined"], "failed_partitions": failed,
        "failed_left_out": counts["failed"] - len(failed),
        "metrics": record.metrics, "spark_ui_url": record.spark_ui_url,
    }
