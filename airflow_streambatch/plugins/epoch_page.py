"""The epoch view as one server-rendered HTML page (no script, no external asset).

Every value on the page comes from user data (input paths, errors, tracebacks, DAG and
task ids) and goes through `_e` (``html.escape``), attribute values included. The page
reloads itself every few seconds while the task runs, so the progress bar follows the
commits; the Airflow UI shows it in an iframe on the task instance page.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone

from airflow_streambatch.plugins.epoch_data import EpochView, partition_rows, totals

REFRESH_S = 3  # while the task runs: the operator publishes progress every 2 s

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px;color:#1a202c;font-size:14px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:20px 0 6px}
.muted{color:#5a6472} code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
table{border-collapse:collapse;width:100%} th,td{border-bottom:1px solid #e2e8f0;padding:4px 8px;
text-align:left;vertical-align:top} th{background:#f7fafc} td.num{text-align:right;white-space:nowrap}
.bar{display:flex;height:14px;background:#edf2f7;border-radius:7px;overflow:hidden;max-width:640px}
.bar .committed{background:#38a169} .bar .failed{background:#e53e3e}
.state{display:inline-block;padding:1px 8px;border-radius:9px;font-weight:600;font-size:12px}
.state.committed,.state.succeeded,.state.success{background:#c6f6d5;color:#22543d}
.state.failed{background:#fed7d7;color:#822727}
.state.pending,.state.running,.state.queued{background:#feebc8;color:#7b341e}
.hint{background:#fffaf0;border-left:4px solid #dd6b20;padding:8px 12px;margin:12px 0;max-width:900px}
.note{background:#ebf8ff;border-left:4px solid #3182ce;padding:8px 12px;margin:12px 0;max-width:900px}
pre{white-space:pre-wrap;word-break:break-word;background:#f7fafc;padding:8px;margin:4px 0;max-height:420px;
overflow:auto} details summary{cursor:pointer;color:#2b6cb0}
tr.partition.failed td{border-bottom:none} tr.traceback td{padding-top:0} ul.files{margin:0;padding-left:16px}
"""


def _e(value) -> str:
    """Escaped text of any value (None as an empty string)."""
    return html.escape("" if value is None else str(value), quote=True)


def _bytes(n) -> str:
    if not isinstance(n, (int, float)):
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _count(n) -> str:
    return f"{n:,}" if isinstance(n, int) else _e(n)


def _when(value) -> str:
    if isinstance(value, (int, float)):
        value = datetime.fromtimestamp(value, timezone.utc)
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if isinstance(value, datetime) else ""


def _input(view: EpochView, index: int, label: str) -> str:
    """A partition's input: its file, and its row-group range where the manifest split the file."""
    parts = view.record.epoch.get("partitions", []) if view.record is not None else []
    entry = parts[index] if 0 <= index < len(parts) else {}
    text = f"<code>{_e(entry.get('path', label))}</code>"
    if entry.get("row_groups"):
        start, stop = entry["row_groups"]
        text += (f"<br><span class='muted'>row groups {_e(start)}..{_e(stop - 1)}"
                 f" ({_e(_bytes(entry.get('range_bytes')))} of {_e(_bytes(entry.get('size')))})</span>")
    elif "size" in entry:
        text += f"<br><span class='muted'>whole file, {_e(_bytes(entry['size']))}</span>"
    return text


def render(view: EpochView) -> str:
    """The whole page for ``view``."""
    t = view.task
    title = f"Epoch of {t.dag_id}.{t.task_id}"
    refresh = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if view.running else ""
    body = [
        f"<h1>{_e(title)}</h1>",
        f"<div class='muted'>run <code>{_e(t.run_id)}</code>"
        + (f", map index {_e(t.map_index)}" if t.map_index >= 0 else "")
        + f" &middot; task <span class='state {_e(t.state)}' id='task-state'>{_e(t.state or 'none')}</span>"
        f" try {_e(t.try_number)} &middot; <a href=''>refresh</a></div>",
    ]
    body += _status(view)
    body += _output(view)
    if view.record is not None:
        body += _partitions(view)
        body += _operators(view)
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title>{refresh}<style>{STYLE}</style></head>"
            f"<body>{''.join(body)}</body></html>")


def _status(view: EpochView) -> list[str]:
    from airflow_streambatch.epochs.states import EpochState  # here: the epochs package imports pyspark

    out = []
    record, counts = view.record, totals(view)
    if record is not None:
        out.append(f"<p>Epoch <code>{_e(record.epoch.get('interval_start'))}</code> .. "
                   f"<code>{_e(record.epoch.get('interval_end'))}</code>: record says "
                   f"<span class='state {_e(record.status)}' id='epoch-status'>{_e(record.status)}</span>"
                   f" (epoch try {_e(record.tries)}, updated {_e(_when(record.updated_at))})</p>")
    if view.running and (record is None or view.record_predates_try):
        out.append(f"<div class='note' id='starting'>Try {_e(view.task.try_number)} is {_e(view.task.state)}: "
                   "Spark is starting or the epoch has not begun, so nothing of this try is recorded yet"
                   + (" (the record below is the previous try's)" if record is not None else "")
                   + f". This page reloads every {REFRESH_S} s.</div>")
    elif record is not None and record.status == EpochState.RUNNING and not view.running:
        out.append(f"<div class='hint'>The record says running, but the task is {_e(view.task.state)}: its "
                   "driver stopped without recording why (killed). The next try resumes from the committed "
                   "partitions.</div>")
    if record is not None and record.reason:
        out.append(f"<p>Why it stopped: <code>{_e(record.reason)}</code></p>")
    total = counts.get("partitions")
    if isinstance(total, int) and total > 0:
        committed, failed = counts.get("committed") or 0, counts.get("failed") or 0
        out.append(
            f"<p id='progress-text'><b>{committed:,} of {total:,} partitions committed</b>"
            f" ({_count(counts.get('committed_this_try'))} by this try), {failed:,} failed, "
            f"{_count(counts.get('pending'))} not finished &middot; {_count(counts.get('rows'))} rows, "
            f"{_e(_bytes(counts.get('bytes')))} written"
            + (f" &middot; <span id='quarantined'>{counts['quarantined']:,} rows quarantined</span>"
               if counts.get("quarantined") else "") + "</p>"
            f"<div class='bar' role='progressbar' aria-valuemin='0' aria-valuemax='{total}' "
            f"aria-valuenow='{committed}' id='progress'>"
            f"<div class='committed' style='width:{100 * committed / total:.2f}%'></div>"
            f"<div class='failed' style='width:{100 * failed / total:.2f}%'></div></div>")
    elif total == 0:
        out.append("<p>The epoch has no input partitions (a quiet interval): committed empty.</p>")
    rerun = (counts.get("failed") or 0) + (counts.get("pending") or 0)
    if rerun and counts.get("status") == EpochState.FAILED and not view.running:
        kept = counts.get("committed") or 0
        out.append(f"<div class='hint' id='clear-hint'><b>Clear this task to rerun {rerun} partition"
                   f"{'s' if rerun != 1 else ''}</b>: the {kept:,} committed partition{'s' if kept != 1 else ''} "
                   "stay as they are and run nothing (Airflow UI: Clear on this task instance; REST: "
                   f"<code>POST /api/v2/dags/{_e(view.task.dag_id)}/clearTaskInstances</code>).</div>")
    return out


def _output(view: EpochView) -> list[str]:
    out = ["<h2>Output</h2>"]
    if not view.output_path:
        what = (f"This task is a {_e(view.task.operator)}: no StreamBatchOperator epoch here, or no"
                if view.task.operator and "StreamBatch" not in view.task.operator else "No")
        out.append(f"<p class='muted' id='no-output'>{what} try of this task has said where its output goes yet "
                   "(no Task State Store summary, XCom or rendered <code>output_path</code>).</p>")
        return out
    from airflow_streambatch.epochs.checkpoint import as_uri, record_uri

    out.append(f"<p>Location: <code id='output-path'>{_e(as_uri(view.output_path))}</code><br>"
               f"<span class='muted'>epoch record <code>{_e(record_uri(view.output_path))}</code> "
               f"(found through {_e(view.output_source)})</span></p>")
    spark_ui = (view.record.spark_ui_url if view.record is not None else None) or (view.progress or {}).get(
        "spark_ui_url")
    if spark_ui:
        out.append(f"<p class='muted'>Spark UI of the try that wrote the record: <code>{_e(spark_ui)}</code></p>")
    if view.record_error:
        out.append(f"<div class='hint'>The epoch record could not be read by the API server: "
                   f"<code>{_e(view.record_error)}</code>. It needs the same access to the output as the "
                   "workers.</div>")
    elif view.record is None:
        out.append("<p class='muted'>No epoch record there yet.</p>")
    return out


def _partitions(view: EpochView) -> list[str]:
    from airflow_streambatch.epochs.states import EpochState, PartitionState

    record = view.record
    unfinished, committed, unfinished_left, committed_left = partition_rows(record)
    out = []
    if unfinished:
        failed = sum(p.state == PartitionState.FAILED for p in record.partitions)
        live = record.status == EpochState.RUNNING  # pending: still to run, not given up
        heading = "Not committed yet" if live else "Failed or not finished"
        pending_text = "not committed yet" if live else "did not finish"
        out.append(f"<h2>{heading} ({failed} failed)</h2><table id='failed-partitions'><tr>"
                   "<th>#</th><th>input</th><th>state</th><th>operator</th><th>error</th></tr>")
        for p in unfinished:
            error = f"<code>{_e(p.error)}</code>" if p.error else (f"<span class='muted'>{pending_text}</span>"
                                                                    if p.state == PartitionState.PENDING else "")
            out.append(f"<tr class='partition {_e(p.state)}' data-index='{_e(p.index)}'><td class='num'>"
                       f"{_e(p.index)}</td><td>{_input(view, p.index, p.path)}</td><td><span class='state "
                       f"{_e(p.state)}'>{_e(p.state)}</span></td><td>{_e(p.operator)}</td><td>{error}</td></tr>")
            if p.traceback:  # a row of its own, the table's width: a traceback in a column is unreadable
                out.append(f"<tr class='traceback' data-index='{_e(p.index)}'><td></td><td colspan='4'><details>"
                           f"<summary>traceback of partition {_e(p.index)}</summary><pre>{_e(p.traceback)}</pre>"
                           "</details></td></tr>")
        out.append("</table>")
        if unfinished_left:
            out.append(f"<p class='muted'>... and {unfinished_left:,} more, in the epoch record.</p>")
    if committed:
        out.append("<h2>Committed</h2><table id='committed-partitions'><tr><th>#</th><th>input</th><th>state</th>"
                   "<th>rows</th><th>bytes</th><th>output files</th><th>committed by</th></tr>")
        for p in committed:
            files = "".join(f"<li><code>{_e(f)}</code></li>" for f in p.files[:20])
            if len(p.files) > 20:
                files += f"<li class='muted'>... {len(p.files) - 20} more</li>"
            by = f"epoch try {record.tries} (this try)" if p.this_try else "an earlier try"
            out.append(f"<tr class='partition committed' data-index='{_e(p.index)}' data-this-try="
                       f"'{'true' if p.this_try else 'false'}'><td class='num'>{_e(p.index)}</td>"
                       f"<td>{_input(view, p.index, p.path)}</td><td><span class='state committed'>committed"
                       f"</span></td><td class='num'>{_count(p.rows)}{_quarantined(p)}</td>"
                       f"<td class='num'>{_e(_bytes(p.bytes))}</td>"
                       f"<td><ul class='files'>{files}</ul></td><td title='engine run {_e(p.run_id)}'>{_e(by)}"
                       "</td></tr>")
        out.append("</table>")
        if committed_left:
            out.append(f"<p class='muted'>... and {committed_left:,} more committed, in the epoch record.</p>")
    return out


def _quarantined(p) -> str:
    """The rows of a committed partition set aside beside its files (``on_row_error="quarantine"``)."""
    return f"<br><span class='quarantined'>+{p.quarantined:,} quarantined</span>" if p.quarantined else ""


def _operators(view: EpochView) -> list[str]:
    metrics = view.record.metrics or {}
    ops = metrics.get("operators") or []
    if not ops:
        return []
    out = [f"<h2>Operators of epoch try {_e(view.record.tries)}</h2><table id='operators'><tr><th>operator</th>"
           "<th>tasks</th><th>rows</th><th>bytes</th><th>wall s</th><th>s in tasks</th><th>rows/s</th></tr>"]
    for op in ops:
        wall = op.get("wall_s") or 0
        rate = (op.get("rows") or 0) / wall if wall else 0.0
        rerun = f" (+{_e(op['tasks_rerun'])} rerun)" if op.get("tasks_rerun") else ""
        out.append(f"<tr><td><code>{_e(op.get('name'))}</code></td><td class='num'>{_count(op.get('tasks'))}"
                   f"{rerun}</td><td class='num'>{_count(op.get('rows'))}</td><td class='num'>"
                   f"{_e(_bytes(op.get('bytes')))}</td><td class='num'>{wall:.1f}</td><td class='num'>"
                   f"{(op.get('task_s') or 0):.1f}</td><td class='num'>{rate:,.0f}</td></tr>")
    out.append("</table>")
    if metrics.get("wall_s") is not None:
        out.append(f"<p class='muted'>engine wall time {_e(metrics['wall_s'])} s, "
                   f"{_count(metrics.get('spark_jobs'))} Spark job(s)</p>")
    return out
