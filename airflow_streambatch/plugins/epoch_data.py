"""What the epoch view shows, gathered where each piece lasts.

* the task instance (metadata database): its state and try, so the view can tell a
  try that is starting (Spark start-up, before its first commit) from one that ran;
* the Task State Store's bounded summary (key ``epoch_progress``, written by the
  operator every few seconds while partitions commit) and the XCom summary (pushed
  when a try ends): counts, and where the output and the record are;
* the durable epoch record ``<output>/_epoch.json`` with its journal: every
  partition's input, state, rows, bytes, files and error. It is read from the output's
  filesystem by the API server process, so that process needs the same access to the
  output (an object store's credentials) as the workers.

Where a try has not written a summary yet, the output path comes from the task's
rendered ``output_path`` (Airflow stores the rendered fields when the try starts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow_streambatch.epochs.checkpoint import EpochRecord

# the operator's Task State Store key (operators.streambatch.STATE_KEY; test_epoch_view.py checks they agree):
# not imported from there, as that module imports the hook and Spark's session helpers
STATE_KEY = "epoch_progress"
PARTITIONS_SHOWN = 500  # rows per table of the page; the record holds the rest (20,000-partition epochs)


@dataclass
class TaskInstanceView:
    """The Airflow task instance the view is about."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    state: str | None
    try_number: int
    operator: str | None
    start_date: datetime | None
    end_date: datetime | None


@dataclass
class EpochView:
    """Everything one page of the epoch view shows; ``record`` is None until a try has written one."""

    task: TaskInstanceView
    progress: dict | None = None  # the Task State Store's summary (counts, first failures, pointers)
    summary: dict | None = None  # the XCom return value: the same summary, written when a try ends
    output_path: str | None = None
    output_source: str | None = None  # which of the above said where the output is
    record: EpochRecord | None = None
    record_error: str | None = None  # why the record could not be read
    record_predates_try: bool = False  # a running try has not rewritten the record yet (Spark starting)
    notes: list[str] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.task.state in ("running", "queued", "scheduled", "restarting", "up_for_retry")


def _task_instance(session: Session, dag_id: str, run_id: str, task_id: str, map_index: int):
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import select

    return session.scalar(select(TaskInstance).where(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id,
        TaskInstance.map_index == map_index))


def _task_state(session: Session, ti, key: str) -> Any:
    from airflow.models.task_state_store import TaskStateStoreModel
    from sqlalchemy import select

    value = session.scalar(select(TaskStateStoreModel.value).where(
        TaskStateStoreModel.dag_id == ti.dag_id, TaskStateStoreModel.run_id == ti.run_id,
        TaskStateStoreModel.task_id == ti.task_id, TaskStateStoreModel.map_index == ti.map_index,
        TaskStateStoreModel.key == key))
    return json.loads(value) if value is not None else None


def _xcom(session: Session, ti, key: str) -> Any:
    from airflow.models.xcom import XComModel
    from sqlalchemy import select

    row = session.scalars(select(XComModel).where(
        XComModel.dag_id == ti.dag_id, XComModel.run_id == ti.run_id, XComModel.task_id == ti.task_id,
        XComModel.map_index == ti.map_index, XComModel.key == key)).first()
    return XComModel.deserialize_value(row) if row is not None else None


def _rendered_output_path(session: Session, ti) -> str | None:
    from airflow.models.renderedtifields import RenderedTaskInstanceFields

    fields = RenderedTaskInstanceFields.get_templated_fields(ti, session=session) or {}
    path = fields.get("output_path")
    return path if isinstance(path, str) and path else None


def gather(session: Session, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> EpochView | None:
    """The epoch view of one task instance; None when there is no such task instance."""
    from airflow_streambatch.operators.links import EpochOutputLink

    ti = _task_instance(session, dag_id, run_id, task_id, map_index)
    if ti is None:
        return None
    view = EpochView(TaskInstanceView(dag_id, run_id, task_id, map_index, _state_name(ti.state), ti.try_number,
                                      getattr(ti, "operator", None), ti.start_date, ti.end_date))
    progress = _task_state(session, ti, STATE_KEY)
    view.progress = progress if isinstance(progress, dict) else None
    summary = _xcom(session, ti, "return_value")
    view.summary = summary if isinstance(summary, dict) else None
    # the "Epoch output" link's XCom: the output URI (under `output_key` where the link class has one; its
    # `xcom_key` then holds the link itself, this view's http URL, which says nothing about the output)
    link_uri = _xcom(session, ti, getattr(EpochOutputLink, "output_key", EpochOutputLink.xcom_key))
    candidates = [
        ("the Task State Store", (view.progress or {}).get("output_path")),
        ("the task's XCom summary", (view.summary or {}).get("output_path")),
        ("the task's output link", link_uri if isinstance(link_uri, str)
         and not link_uri.startswith(("http://", "https://")) else None),
    ]
    for source, path in candidates:
        if path:
            view.output_path, view.output_source = path, source
            break
    else:
        path = _rendered_output_path(session, ti)
        if path:
            view.output_path, view.output_source = path, "the task's rendered output_path"
    if view.output_path:
        _load_record(view)
    return view


def _state_name(state) -> str | None:
    return getattr(state, "value", state)


def _load_record(view: EpochView) -> None:
    """Read the durable record; a failure to read it is shown, not raised (the summaries still say a lot)."""
    from airflow_streambatch.epochs.checkpoint import EpochCheckpoint
    from airflow_streambatch.epochs.states import EpochState

    try:
        view.record = EpochCheckpoint(view.output_path).load()
    except Exception as exc:  # noqa: BLE001 - permissions, credentials, a corrupt file: all are the page's to say
        view.record_error = f"{type(exc).__name__}: {exc}"
        return
    started = view.task.start_date
    if view.record is not None and view.running and started is not None and view.record.status != EpochState.RUNNING:
        view.record_predates_try = view.record.updated_at < started.timestamp()


def partition_rows(record: EpochRecord, limit: int = PARTITIONS_SHOWN) -> tuple[list, list, int, int]:
    """The record's partitions for the page's two tables: failed or not finished first, then committed,
    each cut at ``limit``; with how many of each were left out."""
    from airflow_streambatch.epochs.states import PartitionState  # here: the epochs package imports pyspark

    unfinished = [p for p in record.partitions if p.state != PartitionState.COMMITTED]
    committed = [p for p in record.partitions if p.state == PartitionState.COMMITTED]
    return (unfinished[:limit], committed[:limit], max(0, len(unfinished) - limit),
            max(0, len(committed) - limit))


def totals(view: EpochView) -> dict:
    """Counts for the header and progress bar: from the record where there is one (it follows every
    commit through its journal), else from the latest summary."""
    if view.record is not None:
        counts = view.record.counts()
        return {"partitions": len(view.record.partitions), "status": view.record.status,
                "tries": view.record.tries, **counts}
    latest = view.progress or view.summary
    if latest is None:
        return {}
    keys = ("partitions", "committed", "committed_this_try", "failed", "pending", "rows", "bytes", "quarantined",
            "status", "tries")
    return {k: latest.get(k) for k in keys}
