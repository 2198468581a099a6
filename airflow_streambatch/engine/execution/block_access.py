"""The driver's view of where each block lives: reading it, removing it, following it when rebuilt.

On a cluster a block stays on the host that wrote it. The driver reads an output
block there (`worker/transport.py`), asks that host's agent to remove a block it
released, and, when lineage rebuilds a lost block on another host, sends later
readers to the new host: tasks launched after a rebuild get the new location.

Removals on other hosts go through one background thread: a host that died answers
no one, and the scheduler loop must not wait for it (its agent, or its death, took
the files anyway).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from dataclasses import replace

import pyarrow as pa

from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.worker.transport import delete_blocks, read_any


class BlockAccess:
    def __init__(self, control: ControlInfo | None):
        self.control = control
        self._moved: dict[str, str] = {}  # block file -> location of the host a rebuild wrote it on
        self._lock = threading.Lock()  # the consumer reads from its own thread
        self.fetched_bytes = 0  # bytes the driver read from other hosts
        self._removals: queue.Queue[BlockRef] = queue.Queue()
        self._remover: threading.Thread | None = None

    def current(self, ref: BlockRef) -> BlockRef:
        """``ref`` pointing at the host that holds its file now."""
        location = self._moved.get(ref.path)
        return ref if location is None or location == ref.location else replace(ref, location=location)

    def relocated(self, blocks: list[BlockRef]) -> None:
        """A lineage replay wrote ``blocks`` again, on the host their references name."""
        for block in blocks:
            self._moved[block.path] = block.location

    def read(self, ref: BlockRef) -> pa.Table:
        table, moved = read_any(self.current(ref), self.control)
        with self._lock:
            self.fetched_bytes += moved
        return table

    def delete(self, ref: BlockRef) -> None:
        """Remove a block's file from the host that holds it (in the background if that is another)."""
        ref = self.current(ref)
        if not ref.location or os.path.exists(ref.path):
            with contextlib.suppress(FileNotFoundError):
                os.remove(ref.path)
            return
        with self._lock:
            if self._remover is None:
                self._remover = threading.Thread(target=self._remove_remote, name="streambatch-block-removal",
                                                 daemon=True)
                self._remover.start()
        self._removals.put(ref)

    def _remove_remote(self) -> None:
        """Batch what is queued per host; a host that did not answer is not asked again."""
        unreachable: set[str] = set()
        while True:
            batch = [self._removals.get()]
            while not self._removals.empty():
                batch.append(self._removals.get_nowait())
            by_host: dict[str, list[str]] = {}
            for ref in batch:
                by_host.setdefault(ref.location, []).append(ref.path)
            for location, paths in by_host.items():
                if location not in unreachable and not delete_blocks(location, paths, self.control):
                    unreachable.add(location)
