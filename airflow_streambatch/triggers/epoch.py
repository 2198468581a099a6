"""EpochTrigger: the deferrable EpochSensor's wait, run in the triggerer instead of a worker slot."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_streambatch.epochs.frontier import FrontierSpec
from airflow_streambatch.epochs.manifest_store import ManifestTooLargeError, freeze, whole_manifest
from airflow_streambatch.epochs.sensing import check_epoch
from airflow_streambatch.hooks.object_store import ObjectStoreHook, StoreEnvironment, applied

# A triggerer runs many triggers in one process, whose environment they share: the polls of triggers with
# a storage connection take turns, each holding its connection's variables only while it reads the store.
_STORE_ENVIRONMENT = threading.Lock()


class EpochTrigger(BaseTrigger):
    """Polls an epoch's frontier every ``poll_interval`` seconds; fires once with the frozen manifest.

    The event is ``{"status": "passed", "manifest_pointer": {...}}`` when ``manifest_dir``
    is given (the manifest is written there: a trigger event is stored in Airflow's
    database, so it stays a few hundred bytes however many files the epoch has),
    ``{"status": "passed", "manifest": {...}}`` without it or when the write failed (the
    triggerer may lack the workers' rights; the sensor then writes it), only for a manifest
    within `MAX_WHOLE_MANIFEST_BYTES`, or ``{"status": "error", "message": ...}`` when a
    check raised (a malformed watermark, an unreadable path) or the manifest is too large
    to travel whole. Filesystem calls run in a thread so the triggerer's event loop never
    blocks.

    The frontier arguments are those of `FrontierSpec` (``spec``), under the sensor's
    keyword names; `for_spec` builds a trigger from a spec. ``storage_conn_id``: the
    connection whose object-store credentials the polls use (`hooks/object_store.py`),
    read in the triggerer; only its id is serialized, never a secret. Its variables are
    set in the triggerer's process for each poll's reads and writes, under a lock the
    polls of every `EpochTrigger` with a connection take, and put back after.
    """

    def __init__(self, *, input_path: str, frontier: str, interval_start: str, interval_end: str,
                 marker_path: str | None = None, watermark_path: str | None = None, quiet_period_s: float = 300.0,
                 poll_interval: float = 30.0, state: dict | None = None, manifest_dir: str | None = None,
                 storage_conn_id: str | None = None) -> None:
        super().__init__()
        self.spec = FrontierSpec(frontier, input_path, marker_path, watermark_path, quiet_period_s)
        self.interval_start = interval_start
        self.interval_end = interval_end
        self.poll_interval = poll_interval
        self.state = state
        self.manifest_dir = manifest_dir
        self.storage_conn_id = storage_conn_id

    @classmethod
    def for_spec(cls, spec: FrontierSpec, *, interval_start: str, interval_end: str, poll_interval: float = 30.0,
                 state: dict | None = None, manifest_dir: str | None = None,
                 storage_conn_id: str | None = None) -> EpochTrigger:
        return cls(**spec.to_dict(), interval_start=interval_start, interval_end=interval_end,
                   poll_interval=poll_interval, state=state, manifest_dir=manifest_dir,
                   storage_conn_id=storage_conn_id)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                **self.spec.to_dict(), "interval_start": self.interval_start, "interval_end": self.interval_end,
                "poll_interval": self.poll_interval, "state": self.state, "manifest_dir": self.manifest_dir,
                "storage_conn_id": self.storage_conn_id,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        frontier = self.spec.build()
        state = self.state
        store = None
        while True:
            try:
                if self.storage_conn_id is not None and store is None:
                    store = await ObjectStoreHook(self.storage_conn_id).astore_environment()
                manifest, state = await asyncio.to_thread(_with_store, store, check_epoch, frontier,
                                                          self.spec.input_path, self.interval_start,
                                                          self.interval_end, state, time.time())
            except Exception as exc:  # reported to the sensor, which fails with it
                yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
                return
            if manifest is not None:
                self.log.info("Epoch %s..%s passed its %s frontier with %d input file(s)", self.interval_start,
                              self.interval_end, self.spec.kind, len(manifest.partitions))
                try:
                    frozen = await asyncio.to_thread(_with_store, store, self._frozen, manifest)
                except ManifestTooLargeError as exc:
                    yield TriggerEvent({"status": "error", "message": str(exc)})
                    return
                yield TriggerEvent({"status": "passed", **frozen})
                return
            await asyncio.sleep(self.poll_interval)

    def _frozen(self, manifest) -> dict:
        """The event's manifest: a pointer to the file written under ``manifest_dir``, or (none given, or it
        cannot be written from the triggerer) the manifest itself if small, which the sensor then writes
        from the worker or pushes whole. Raises `ManifestTooLargeError` for a big one that has to travel."""
        task = f"EpochTrigger on {self.spec.input_path}"
        if self.manifest_dir:
            try:
                return {"manifest_pointer": freeze(manifest, self.manifest_dir)}
            except OSError as exc:
                self.log.warning("cannot write the epoch manifest under %s (%s); the event carries it whole and "
                                 "the sensor writes it", self.manifest_dir, exc)
                task = f"{task} (cannot write under manifest_dir {self.manifest_dir!r} from the triggerer: {exc})"
        return {"manifest": whole_manifest(manifest, task)}


def _with_store(store: StoreEnvironment | None, fn, *args):
    """``fn(*args)`` in a worker thread, with ``store``'s variables set in the process meanwhile (none: as is)."""
    if store is None:
        return fn(*args)
    with _STORE_ENVIRONMENT, applied(store):
        return fn(*args)
