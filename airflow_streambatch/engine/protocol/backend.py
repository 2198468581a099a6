"""The contract between the scheduler loop and whatever runs its tasks.

The loop (`execution/executor.py`) packs tasks into jobs and reads what comes back; it
never needs to know that Spark runs them. `spark/backend.py` is the backend a user
runs; tests of the loop run it against one in their own process, so scheduling,
grants, retries, lineage and liveness are checked in milliseconds, without Spark.
"""

from __future__ import annotations

import queue
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass
class JobOutcome:
    """What came back from one job: per-task result blobs, or the exception."""

    launch_id: int
    results: list[bytes] | None
    error: BaseException | None
    wall_s: float


class Backend(Protocol):
    """Runs task groups as jobs. ``outcomes`` receives each job's `JobOutcome` when it ends,
    and the control plane puts a job's check-ins there too (`execution/check_ins.py`)."""

    outcomes: queue.Queue

    def submit(self, launch_id: int, pool: str, op_blob: bytes, groups: list[list[bytes]],
               resources: Mapping[str, float] | None = None) -> None:
        """Run ``groups`` (one list of pickled task specs per partition) as one job, in the background,
        each partition through `worker.task_runner.run_partition` with the operator's payload ``op_blob``."""

    def run_now(self, op_blob: bytes, spec_blob: bytes) -> bytes:
        """Run one task in the calling thread and return its pickled result (lineage replays)."""

    def cancel_launch(self, launch_id: int) -> None:
        """Stop one job (a task ran past ``task_timeout_s``); its outcome still arrives."""

    def cancel(self) -> None:
        """Stop every job of the run."""

    def close(self) -> None:
        """The run ended: release what the backend holds for it."""
