"""Streaming task output: blocks leave a running task as they are cut, under the driver's grants.

A task that decodes one video into 200 MiB of frames must not hold all of it until
it finishes (paper section 4.2.1; Ray Data's streaming generators). Blocks are files,
so the protocol is files too, in ``<run_dir>/streams/`` (tmpfs locally, the shared
block directory on a cluster):

* the task appends one JSON line per block it writes to ``<task>.stream``, a
  ``{"wait": i}`` line when it must stop before writing block ``i``, and a
  ``{"done": n}`` line when it has written its ``n`` blocks (in a Spark job that runs
  several tasks one after another in a partition, the job ends much later);
* the driver reads those lines every turn of its loop, passes each block downstream
  at once (the consumer may start before the producer ends), and writes the number
  of blocks the task may write to ``<task>.grant`` when memory allows, or ``YIELD``
  when the task's slot is needed by an operator that frees memory: the task stops
  (`TaskYielded`) and is run again later, skipping the blocks it delivered.

A task may write ``spec.granted`` blocks without asking: the driver gives each task
the blocks its launch estimate already reserved, so tasks whose output is as
expected never wait. ``spec.skip_blocks`` blocks were delivered by an earlier
attempt of the task: a retry regenerates them (streaming repartition is
deterministic) but neither writes nor announces them, so nothing is delivered twice.

The files are created 0600 in the run's 0700 directory, and the driver still trusts no
path a stream names: it reads, returns and deletes the blocks announced there, so an
announced block must be exactly the file the watched task writes (`execution/stream_watcher.py`).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

from airflow_streambatch.engine.worker.blocks import STREAM_DIR, BlockRef

NO_GRANT_LIMIT = 1 << 62  # lineage replays and unstreamed tasks write freely
YIELD = -1  # a grant that tells a waiting task to stop and give its slot back (it is run again later)


class TaskYielded(Exception):
    """Raised in a task the driver preempted while it waited for memory."""


def stream_name(op_index: int, task_key: str, launch_id: int) -> str:
    """One name per attempt: a retried task is launched again, under a new launch id."""
    return f"{op_index}-{task_key}-{launch_id}"


class OutputStream:
    """The task side: waits for grants before writing a block, announces each block written."""

    def __init__(self, run_dir: str, name: str, granted: int, poll_s: float = 0.01):
        self.dir = os.path.join(run_dir, STREAM_DIR)
        self.path = os.path.join(self.dir, f"{name}.stream")
        self.grant_path = os.path.join(self.dir, f"{name}.grant")
        self.granted = granted
        self.poll_s = poll_s
        self.waited_s = 0.0

    def wait_for(self, index: int) -> None:
        """Return once block ``index`` may be written (the driver granted ``index + 1`` blocks)."""
        if index < self.granted:
            return
        self._append({"wait": index})
        start = time.perf_counter()
        while index >= self.granted:
            time.sleep(self.poll_s)
            try:
                with open(self.grant_path) as f:
                    grant = int(f.read() or 0)
                if grant == YIELD:
                    raise TaskYielded(f"preempted before block {index}")
                self.granted = max(self.granted, grant)
            except FileNotFoundError:
                if not os.path.isdir(self.dir):  # the run is over (driver gone or cancelled)
                    raise RuntimeError(f"the run's block directory {self.dir} is gone; stopping") from None
        self.waited_s += time.perf_counter() - start

    def announce(self, ref: BlockRef) -> None:
        self._append({"block": asdict(ref)})

    def finish(self, blocks: int) -> None:
        self._append({"done": blocks})

    def _append(self, record: dict) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:  # one write per line: the driver reads whole lines only
            f.write(json.dumps(record) + "\n")
