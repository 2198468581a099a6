"""The pipeline the read-pruning operator tests run: it reports what each batch it got looked like.

Each batch's columns and ids go to a JSON file under ``report_dir`` (written on Spark's
executors), so a test sees what the read handed the pipeline, per batch, whatever process
ran it. ``fail_flag``: while that file exists, a batch holding an id at or past
``fail_from`` fails its partition (a partition to clear and rerun).
"""

from __future__ import annotations

import json
import os
import uuid
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc


def report_batches(ds, epoch, *, report_dir: str, fail_flag: str | None = None, fail_from: int = -1):
    os.makedirs(report_dir, exist_ok=True)
    return ds.map_batches(partial(_report, report_dir=report_dir, fail_flag=fail_flag, fail_from=int(fail_from)),
                          batch_format="pyarrow")


def _report(batch: pa.Table, report_dir: str, fail_flag: str | None, fail_from: int) -> pa.Table:
    ids = batch["id"].to_pylist()
    with open(os.path.join(report_dir, f"{uuid.uuid4().hex}.json"), "w") as f:
        json.dump({"columns": batch.column_names, "ids": ids}, f)
    if fail_flag and os.path.exists(fail_flag) and fail_from >= 0 and max(ids) >= fail_from:
        raise ValueError(f"rejects ids from {fail_from}")
    return batch.append_column("score", pc.multiply(batch["id"], 2))


def take_reports(report_dir) -> list[dict]:
    """Every batch reported since the last call (and forget them)."""
    found = []
    for name in sorted(os.listdir(report_dir)):
        with open(os.path.join(report_dir, name)) as f:
            found.append(json.load(f))
        os.remove(os.path.join(report_dir, name))
    return found
