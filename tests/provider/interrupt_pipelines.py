"""A pipeline that sleeps in its UDF, so tests can interrupt an epoch while Spark work runs.

Each map task touches ``<started_dir>/<pid>-<uuid>`` when it starts, then sleeps; the
pipeline function (run in the driver) writes the driver's pid to ``<started_dir>/driver.pid``.
"""

from __future__ import annotations

import os
import time
import uuid
from functools import partial


def _sleep(batch, started_dir: str, sleep_s: float):
    open(os.path.join(started_dir, f"task-{os.getpid()}-{uuid.uuid4().hex}"), "w").close()
    time.sleep(sleep_s)
    return batch


def sleepy(ds, epoch, *, started_dir: str, sleep_s: float = 120.0):
    os.makedirs(started_dir, exist_ok=True)
    with open(os.path.join(started_dir, "driver.pid"), "w") as f:
        f.write(str(os.getpid()))
    return ds.map_batches(partial(_sleep, started_dir=started_dir, sleep_s=float(sleep_s)), batch_format="pyarrow")


def tasks_started(started_dir) -> int:
    return len([n for n in os.listdir(started_dir) if n.startswith("task-")]) if os.path.isdir(started_dir) else 0
