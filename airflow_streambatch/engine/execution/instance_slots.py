"""The driver side of live-instance slots: at most ``concurrency`` live instances of a
stateful UDF class per operator and run, across every Python worker of every host.

Why the driver: Ray's ``concurrency=n`` for a class is an actor pool of ``n`` actors, so
at most ``n`` models are loaded. Spark keeps several Python workers per executor and
reuses them, each caching its own instance (`worker/udf.py`), so capping running tasks
(`resources.py`) leaves idle instances alive in other workers. Executors share no
directory with each other or the driver, but every task reaches the driver's control
plane (`control_server.py`); this table, behind it, is the arbiter.

The protocol (`worker/instance_lease.py` is the task side):

* ``acquire``: a task about to build an instance asks for a slot for (run, operator uid).
  Granted while fewer than ``cap`` holders are live; otherwise the requester counts as
  waiting, and the call blocks (at most ``wait_s``) until a slot frees. The task calls
  again until ``DataContext.control_timeout_s`` runs out. A build ahead of need (``ahead``,
  `DataContext.build_ahead`) takes a free slot or none: it neither waits nor makes anyone release.
* ``poll``: a holder's daemon thread long-polls while it holds instances; the answer names
  holders that must release: their run ended, the driver forgot them (expired), or a
  requester waits (``wanted``: said to an idle holder, or once to a busy one, which then
  offers at the end of its task).
* ``offer``: an idle holder asks before deleting its instance, so that one waiter makes one
  holder release, not all of them.
* ``released``: the instance is gone; its slot is free.

A holder that neither polls nor calls for ``ttl_s`` (its process died) loses its slot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

log = logging.getLogger("airflow_streambatch.engine.progress")

MAX_WAIT_S = 5.0  # the longest one call is held in the driver (it occupies a server thread)
WAITER_GRACE_S = 3.0  # a requester whose call returned without a slot still counts as waiting: it calls again
ENDED_RUNS_KEPT = 4096  # ended run ids remembered, so a late request of one is told so


@dataclass
class _Holder:
    last_seen: float
    polling: int = 0  # polls of this holder in progress: a holder inside a poll is alive
    releasing: bool = False  # its offer was accepted: it is deleting its instance


@dataclass
class _Slots:
    """One operator of one run: its cap, live holders and waiting requesters."""

    cap: int
    ttl_s: float
    holders: dict[str, _Holder] = field(default_factory=dict)
    waiters: dict[str, float] = field(default_factory=dict)  # requester -> until when it counts as waiting

    def need(self, now: float) -> int:
        """Releases wanted: waiters beyond the free slots and the releases under way."""
        for name, until in list(self.waiters.items()):
            if until < now:
                del self.waiters[name]
        free = max(0, self.cap - len(self.holders))
        releasing = sum(h.releasing for h in self.holders.values())
        return max(0, len(self.waiters) - free - releasing)

    def expire(self, now: float, where: str) -> None:
        for name, holder in list(self.holders.items()):
            if holder.polling == 0 and now - holder.last_seen > self.ttl_s:
                del self.holders[name]
                log.warning("%s: the holder of a stateful UDF instance (%s) was not heard from for %.0f s (its "
                            "process died?); its slot is free again", where, name, self.ttl_s)


class InstanceSlots:
    """Every run's live-instance slots, in one driver. Thread-safe: the Flight server calls
    these from its own threads."""

    def __init__(self):
        self._cond = threading.Condition()
        self._slots: dict[tuple[str, str], _Slots] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()

    # -- the driver's side -----------------------------------------------------------------
    def end_run(self, run_id: str) -> None:
        """The run launches no more tasks: every holder of its instances is told to release."""
        with self._cond:
            self._ended[run_id] = None
            while len(self._ended) > ENDED_RUNS_KEPT:
                self._ended.popitem(last=False)
            now = time.monotonic()
            for key, slots in list(self._slots.items()):  # ended runs whose last holders died are forgotten
                if key[0] in self._ended:
                    slots.expire(now, key[1])
                    if not slots.holders:
                        del self._slots[key]
            self._cond.notify_all()

    def live(self, run_id: str, op: str) -> int:
        """Holders of (run, operator) the driver counts as live."""
        with self._cond:
            slots = self._slots.get((run_id, op))
            return len(slots.holders) if slots else 0

    # -- what tasks call ---------------------------------------------------------------------
    def acquire(self, body: dict) -> dict:
        """A slot for ``body["holder"]``, waiting at most ``wait_s`` for one to free."""
        key, holder = (body["run"], body["op"]), body["holder"]
        deadline = time.monotonic() + min(float(body.get("wait_s", 1.0)), MAX_WAIT_S)
        with self._cond:
            slots = self._slots.setdefault(key, _Slots(int(body["cap"]), float(body["ttl_s"])))
            told = False
            while True:
                now = time.monotonic()
                slots.expire(now, body.get("name", key[1]))
                if len(slots.holders) < slots.cap:
                    slots.waiters.pop(holder, None)
                    slots.holders[holder] = _Holder(now)
                    return {"granted": True, "ended": key[0] in self._ended}
                if body.get("ahead"):  # a build ahead of need takes a free slot or none: nobody releases for it
                    return {"granted": False, "live": len(slots.holders)}
                slots.waiters[holder] = max(deadline, now) + WAITER_GRACE_S
                if now >= deadline:
                    return {"granted": False, "live": len(slots.holders)}
                if not told:  # holders' polls wake: a release is wanted
                    self._cond.notify_all()
                    told = True
                self._cond.wait(min(deadline - now, 0.5))  # expiry is checked again, even without news

    def poll(self, body: dict) -> dict:
        """Wait (at most ``wait_s``) until one of ``body["holders"]`` must release; name those
        that must, with why: ``ended``, ``unknown`` or ``wanted``."""
        entries = body["holders"]
        wait_s = min(float(body.get("wait_s", 1.0)), MAX_WAIT_S)
        with self._cond:
            self._polling(entries, +1)
            try:
                self._cond.wait_for(lambda: self._news(entries), timeout=wait_s)
                return {"release": self._news(entries)}
            finally:
                self._polling(entries, -1)

    def offer(self, body: dict) -> dict:
        """An idle holder offers to release: ``go`` when a waiter still needs its slot."""
        with self._cond:
            slots = self._slots.get((body["run"], body["op"]))
            holder = slots.holders.get(body["holder"]) if slots else None
            if holder is None or body["run"] in self._ended or holder.releasing:
                return {"go": True}
            holder.last_seen = time.monotonic()
            if slots.need(holder.last_seen) > 0:
                holder.releasing = True
                return {"go": True}
            return {"go": False}

    def released(self, body: dict) -> dict:
        """The holder deleted its instance: its slot is free."""
        with self._cond:
            key = (body["run"], body["op"])
            slots = self._slots.get(key)
            if slots is not None:
                slots.holders.pop(body["holder"], None)
                if key[0] in self._ended and not slots.holders:
                    del self._slots[key]
            self._cond.notify_all()
        return {}

    # -- helpers (called holding the lock) ---------------------------------------------------
    def _polling(self, entries: list[dict], step: int) -> None:
        now = time.monotonic()
        for entry in entries:
            slots = self._slots.get((entry["run"], entry["op"]))
            holder = slots.holders.get(entry["holder"]) if slots else None
            if holder is not None:
                holder.polling += step
                holder.last_seen = now

    def _news(self, entries: list[dict]) -> dict[str, str]:
        now, news = time.monotonic(), {}
        for entry in entries:
            slots = self._slots.get((entry["run"], entry["op"]))
            holder = slots.holders.get(entry["holder"]) if slots else None
            if entry["run"] in self._ended:
                news[entry["holder"]] = "ended"
            elif holder is None:
                news[entry["holder"]] = "unknown"
            elif not holder.releasing and (entry.get("idle") or not entry.get("told")) and slots.need(now) > 0:
                news[entry["holder"]] = "wanted"
        return news
