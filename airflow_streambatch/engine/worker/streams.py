"""Streaming task output: blocks leave a running task as they are cut, under the driver's grants.

A task that decodes one video into 200 MiB of frames must not hold all of it until
it finishes (paper section 4.2.1; Ray Data's streaming generators). The task and the
driver talk over the control plane (`control_client.py`), since on a cluster they
share no directory:

* the task sends one ``block`` record per block it writes, a ``{"wait": i, "bytes": b}``
  request when it must stop before writing block ``i`` of ``b`` bytes, and a
  ``{"done": n}`` record when it has written its ``n`` blocks (in a Spark job that runs
  several tasks one after another in a partition, the job ends much later);
* the driver reads those records every turn of its loop, passes each block downstream
  at once (the consumer may start before the producer ends), and raises the task's
  grant (the number of blocks it may write) when memory allows, or sets it to
  ``YIELD`` when the task's slot is needed by an operator that frees memory: the task
  stops (`TaskYielded`) and is run again later, skipping the blocks it delivered.

A task may write its placement's ``granted`` blocks without asking: the driver gives each task
the blocks its launch estimate already reserved, so tasks whose output is as
expected never wait. Under the strict (conservative) policy it gets bytes instead,
``allowance``: its reservation exactly, whatever its blocks' sizes.
Its first ``skip_blocks`` blocks were delivered by an earlier attempt of the task: a retry
regenerates them (streaming repartition is deterministic) but neither writes nor
announces them, so nothing is delivered twice.

Records carry the run's secret, and the driver still trusts no block a record names
unless it is exactly one the watched task writes (`execution/stream_watcher.py`).
Stream ids and the grant values are contracts of both sides (`protocol/streams.py`).
"""

from __future__ import annotations

import time

from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.protocol.streams import YIELD, StreamRecord
from airflow_streambatch.engine.worker.control_client import call


class TaskYielded(Exception):
    """Raised in a task the driver preempted while it waited for memory."""


GRANT_WAIT_S = 1.0  # how long one grant request waits in the driver before the task asks again


class OutputStream:
    """The task side: waits for grants before writing a block, announces each block written."""

    def __init__(self, control: ControlInfo, name: str, granted: int, allowance: int = 0):
        self.control = control
        self.name = name
        self.granted = granted
        self.allowance = allowance  # bytes it may still write without asking
        self.waited_s = 0.0
        self.sent = 0  # records sent: each carries its number, so a retried call is not taken twice

    def wait_for(self, index: int, nbytes: int = 0) -> None:
        """Return once block ``index`` may be written (the driver granted ``index + 1`` blocks);
        ``nbytes``, its size, lets the driver grant exactly that much memory (0: unknown)."""
        if index < self.granted:
            return
        if 0 < nbytes <= self.allowance:
            self.allowance -= nbytes
            return
        self.allowance = 0  # the driver counts what is left of the reservation into the grant
        start = time.perf_counter()
        self._send(StreamRecord.waiting(index, nbytes))
        while index >= self.granted:
            reply = call(self.control, "grant", {"stream": self.name, "index": index, "wait_s": GRANT_WAIT_S},
                         wait_s=GRANT_WAIT_S)
            self._take(reply)
        self.waited_s += time.perf_counter() - start

    def announce(self, ref: BlockRef) -> None:
        self._send(StreamRecord.written(ref.to_wire()))

    def finish(self, blocks: int) -> None:
        self._send(StreamRecord.finished(blocks))

    def _send(self, record: StreamRecord) -> None:
        self._take(call(self.control, "stream", {"stream": self.name, "seq": self.sent, "record": record.to_wire()}))
        self.sent += 1

    def _take(self, reply: dict) -> None:
        if reply.get("closed"):  # the driver ended this attempt (its job was cancelled or the run stopped)
            raise RuntimeError(f"the driver no longer runs task stream {self.name}; stopping")
        grant = int(reply.get("grant", 0))
        if grant == YIELD:
            raise TaskYielded("preempted while waiting for memory")
        self.granted = max(self.granted, grant)
