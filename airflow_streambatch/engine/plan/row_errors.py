"""Where each transform's failing rows go: planned once, before a run starts.

A transform that quarantines (``on_error="quarantine"``, or ``DataContext.on_row_error``
for the transforms that leave ``on_error`` unset) sets the rows its function fails on
aside beside a write's output, committed with their partition (`worker/row_errors.py`).
So it needs a write of files after it, in the same partitions:

* no write (``take_all``, ``iter_batches``, ...): the rows would have nowhere to go. An
  explicit ``on_error="quarantine"`` is refused; the context's default fails as usual;
* a table write (Delta, Iceberg) commits files the table lists, not staged partitions:
  refused, naming the setting;
* a ``repartition`` between the transform and the write mixes every input partition into
  every output block, so a row set aside has no partition to be committed with: refused.
"""

from __future__ import annotations

from dataclasses import replace

from airflow_streambatch.engine.plan.logical import LogicalOp, Repartition, Transform, WriteFiles
from airflow_streambatch.engine.plan.sort import SortBy

QUARANTINE = "quarantine"


def with_dead_letters(logical: list[LogicalOp], default: str) -> list[LogicalOp]:
    """``logical`` with ``dead_letter`` set on every transform that quarantines its failing rows."""
    sink = logical[-1] if isinstance(logical[-1], WriteFiles) else None
    planned = []
    for i, op in enumerate(logical):
        if isinstance(op, Transform) and not isinstance(op, WriteFiles):
            policy = op.on_error or (default if sink is not None else "fail")
            if policy == QUARANTINE:
                _check_quarantine(op, sink, logical[i + 1:], explicit=op.on_error == QUARANTINE)
                op = replace(op, dead_letter=sink.path)
        planned.append(op)
    return planned


def _check_quarantine(op: Transform, sink: WriteFiles | None, after: list[LogicalOp], explicit: bool) -> None:
    setting = "on_error='quarantine'" if explicit else "DataContext.on_row_error='quarantine'"
    if sink is None:
        raise ValueError(f"{op.name}: {setting} sets failing rows aside beside a write's output, but this dataset "
                         "is not written (write_parquet, write_json, write_csv): write it, or use on_error='fail'")
    if not sink.staged:
        raise ValueError(f"{op.name}: {setting} is not supported for table writes ({sink.name}): failing rows are "
                         "committed beside a directory write's partitions. Write files, or use on_error='fail'")
    if any(isinstance(later, (Repartition, SortBy)) for later in after):
        raise ValueError(f"{op.name}: {setting} cannot be used before a repartition(), sort() or groupby(): the "
                         "write after it commits blocks that mix every input partition, so a row set aside has no "
                         "partition to go with. Quarantine after the repartition, or use on_error='fail'")
