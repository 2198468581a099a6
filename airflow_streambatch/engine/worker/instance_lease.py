"""The task side of live-instance slots: a stateful UDF instance of an operator with a
concurrency cap is built only under a slot the driver granted, and deleted when the
driver needs the slot elsewhere or the run ends (`execution/instance_slots.py`).

Why: Spark keeps several Python workers per executor and reuses them; each would keep
its own instance (a model, maybe GPU memory) until it exits. Ray's ``concurrency=n`` for
a class means at most ``n`` actors, so at most ``n`` live instances; here that bound is
kept across every worker and host of the application.

Costs: a task whose worker already holds the instance makes no call; building one takes
one ``acquire`` call (more while it waits). A daemon thread per worker process that holds
instances long-polls the driver (one call per ``POLL_WAIT_S`` when nothing happens): the
worker's main thread sits blocked reading from the JVM between tasks, so only a thread
of its own can hear that the driver wants the slot back. Releasing takes an ``offer`` and
a ``released`` call: delete the instance, collect garbage, empty the CUDA cache.

A lease held while a task uses it is never released under it: the release waits for the
task's end (`TaskEnv.end_task`, called by `task_runner.run_task`).

Built ahead (`build_ahead`, called by `build_ahead.py`): a Spark partition starts the
build in a thread of its worker, under a slot that is free at that moment (a build ahead
never makes another holder release). A task that finds the build under way waits for it,
as it would wait for its own build.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.worker.control_client import DriverUnreachableError, call

log = logging.getLogger("airflow_streambatch.engine.worker")

POLL_WAIT_S = 5.0  # how long a holder's poll waits in the driver when there is nothing to say
ACQUIRE_WAIT_S = 2.0  # how long one acquire call waits in the driver for a slot to free
HOLDER_TTL_S = 15.0  # a holder not heard from this long (its process died) loses its slot
BUILD_NOTE_S = 30.0  # a task waiting for a build ahead says so this often


class InstanceSlotTimeout(RuntimeError):
    """No live-instance slot of an operator freed within ``DataContext.control_timeout_s``."""


@dataclass(eq=False)
class Lease:
    """One live instance this process holds under a driver's slot."""

    key: tuple[str, str, tuple[str, ...]]  # (run id, operator uid, gpu ids)
    holder: str  # names this lease at the driver
    control: ControlInfo
    instance: Any
    busy: bool = True  # a running task uses it: never released under it
    told: bool = False  # the driver wanted it while busy: offer it at the task's end
    must_go: str = ""  # "ended" / "unknown" / "unreachable": release once idle, whatever the driver needs
    releasing: bool = False
    building: bool = False  # built ahead of its first task, in a thread of this process
    ahead: bool = False  # built ahead and not yet used: its first task counts the build (`instance_for`)
    build_s: float = 0.0  # how long the build ahead took

    def body(self, **more) -> dict:
        return {"run": self.key[0], "op": self.key[1], "holder": self.holder, **more}


_cond = threading.Condition()
_leases: dict[tuple, Lease] = {}
_pollers: dict[str, threading.Thread] = {}  # driver uri -> this process's poll thread


def instance_for(transform, env, build: Callable[[], Any]) -> Any:
    """This worker's instance of ``transform``'s class for the task ``env``, built (under a
    slot the driver grants) if this worker holds none; marked busy until the task ends."""
    key = (env.run_id, transform.uid, env.gpu_ids)
    lease, waited_s = _take_held(key, transform.name, env.control.timeout_s)
    if lease is not None and lease.ahead:  # its build counts once, in its first task, which waited ``waited_s``
        lease.ahead = False
        env.count_build(lease.build_s, waited_s)
    if lease is not None and lease.must_go:  # the driver no longer counts it: go now, build under a new slot
        with _cond:
            lease.busy = False
        _release(lease, ask=False)
        lease = None
    if lease is None:
        lease = _new_lease(key, transform, env.control, build)
    env.leases.append(lease)
    return lease.instance


def end_task(leases: list[Lease]) -> None:
    """The task is over: its instances are idle, or released if the driver asked. Never raises
    (it runs after the task's result is made)."""
    for lease in leases:
        with _cond:
            lease.busy = False
            go = bool(lease.must_go) or lease.told or not _worker_reused()
        if go:
            _release(lease, ask=not lease.must_go and _worker_reused())


def _take_held(key: tuple, name: str, timeout_s: float) -> tuple[Lease | None, float]:
    """The lease this process holds for ``key``, now busy, and the seconds spent waiting for its
    build ahead; waits (bounded) for a release under way."""
    start = time.monotonic()
    with _cond:
        while key in _leases and _leases[key].building:  # as long as building it here would take
            if not _cond.wait(BUILD_NOTE_S) and key in _leases and _leases[key].building:
                log.info("%s: waiting for the instance this worker builds ahead (%.0f s so far)", name,
                         time.monotonic() - start)
        waited_s = time.monotonic() - start
        if not _cond.wait_for(lambda: key not in _leases or not _leases[key].releasing, timeout=timeout_s):
            raise InstanceSlotTimeout(f"{name}: releasing this worker's instance took over {timeout_s:.0f} s; "
                                      "raise DataContext.control_timeout_s")
        lease = _leases.get(key)
        if lease is not None:
            lease.busy = True
        return lease, waited_s


def _new_lease(key: tuple, transform, control: ControlInfo, build: Callable[[], Any]) -> Lease:
    lease = Lease(key, _holder_name(), control, None)
    if _acquire(lease, transform).get("ended"):  # a lineage replay after the run: one task, then it goes
        lease.must_go = "ended"
    with _cond:  # polled from now on: a constructor slower than the slot's expiry keeps its slot
        _leases[key] = lease
        _ensure_poller(control)
    try:
        lease.instance = build()
    except BaseException:
        with _cond:
            if _leases.get(key) is lease:
                del _leases[key]
        _tell_released(lease)
        raise
    return lease


def build_ahead(transform, control: ControlInfo | None, run_id: str, build: Callable[[], Any]) -> None:
    """Start building this process's instance of ``transform`` (a CPU operator's class with a
    concurrency cap) in a thread, if it holds none and the driver has a slot free now. Nothing
    is built where an instance goes with its task (no worker reuse), or outside Spark."""
    if control is None or not _worker_reused():
        return
    key = (run_id, transform.uid, ())
    with _cond:
        if key in _leases:
            return
        lease = _leases[key] = Lease(key, _holder_name(), control, None, busy=True, building=True, ahead=True)
    threading.Thread(target=_build_ahead, args=(lease, transform, build), name="streambatch-build-ahead",
                     daemon=True).start()


def _build_ahead(lease: Lease, transform, build: Callable[[], Any]) -> None:
    """The thread of `build_ahead`. However it ends, ``building`` ends: a task may wait for it."""
    built = False
    try:
        reply = call(lease.control, "instance_acquire", lease.body(
            cap=transform.compute.concurrency, ttl_s=_ttl_s(lease.control), wait_s=0, name=transform.name,
            ahead=True), wait_s=0)
        if not reply.get("granted"):
            return  # every slot is taken: a task builds it when it needs it
        if reply.get("ended"):
            _tell_released(lease)
            return
        with _cond:
            _ensure_poller(lease.control)
        start = time.perf_counter()
        try:
            lease.instance = build()
            lease.build_s = time.perf_counter() - start
        except BaseException:  # noqa: BLE001 - the operator's task builds it again and reports the error
            log.warning("%s: building its instance ahead of its first task failed; the task builds it",
                        transform.name, exc_info=True)
            _tell_released(lease)
            return
        built = True
    except Exception as exc:  # noqa: BLE001 - the driver is unreachable: the task finds out and says so
        log.info("%s: not built ahead: %s", transform.name, exc)
    finally:
        with _cond:
            lease.building = lease.busy = False
            if not built and _leases.get(lease.key) is lease:
                del _leases[lease.key]
            go = built and (bool(lease.must_go) or lease.told)
            _cond.notify_all()
    if go:  # the driver wanted the slot (or ended the run) while it was being built
        _release(lease, ask=not lease.must_go)


def _holder_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _ttl_s(control: ControlInfo) -> float:
    """A holder's time to live at the driver: a dead holder's slot frees before a waiter gives up."""
    return max(2.0, min(HOLDER_TTL_S, control.timeout_s / 2))


def _acquire(lease: Lease, transform) -> dict:
    """Ask the driver for a slot until it grants one, at most ``control_timeout_s``."""
    control, cap = lease.control, transform.compute.concurrency
    ttl_s = _ttl_s(control)
    deadline = time.monotonic() + control.timeout_s
    while True:
        wait_s = max(0.0, min(ACQUIRE_WAIT_S, deadline - time.monotonic()))
        reply = call(control, "instance_acquire",
                     lease.body(cap=cap, ttl_s=ttl_s, wait_s=wait_s, name=transform.name), wait_s=wait_s)
        if reply.get("granted"):
            return reply
        if time.monotonic() >= deadline:
            raise InstanceSlotTimeout(
                f"{transform.name}: no instance of {getattr(transform.fn, '__name__', 'its class')} could be built "
                f"within {control.timeout_s:.0f} s: {reply.get('live', cap)} live instance(s) in other Python "
                f"workers hold its {cap} slot(s) (concurrency={cap}) and none was released (their tasks ran "
                "that long, or more tasks ran than its concurrency). Raise DataContext.control_timeout_s, or the "
                "operator's concurrency")


def _worker_reused() -> bool:
    """Spark reuses this Python worker for later tasks (``spark.python.worker.reuse``, on by
    default); when it does not, or outside Spark, an instance goes with its task."""
    return os.environ.get("SPARK_REUSE_WORKER", "") not in ("", "0")


def _release(lease: Lease, ask: bool) -> None:
    """Delete an idle lease's instance and free its slot; with ``ask``, only if the driver
    still wants the slot. Skipped when a task took the lease meanwhile."""
    with _cond:
        if lease.busy or lease.releasing or _leases.get(lease.key) is not lease:
            return
        lease.releasing = True
    try:
        if ask and not _offer(lease):
            return
        _drop(lease)
        if lease.must_go != "unreachable":
            _tell_released(lease)
    finally:
        with _cond:
            lease.releasing = False
            lease.told = False
            _cond.notify_all()


def _offer(lease: Lease) -> bool:
    try:
        return bool(call(lease.control, "instance_offer", lease.body()).get("go"))
    except Exception as exc:  # noqa: BLE001 - the driver is gone or refused: its slots mean nothing now
        log.warning("releasing a stateful UDF instance: the driver did not answer (%s)", exc)
        lease.must_go = "unreachable"
        return True


def _drop(lease: Lease) -> None:
    """Delete the instance, so its memory (and GPU memory) is freed now, not at exit."""
    with _cond:
        if _leases.get(lease.key) is lease:
            del _leases[lease.key]
    try:
        ref = weakref.ref(lease.instance)
    except TypeError:  # a class with __slots__ and no __weakref__
        ref = None
    lease.instance = None
    gc.collect()
    _empty_cuda_cache()
    if ref is not None and ref() is not None:
        log.warning("a released %s instance is still referenced somewhere; its memory stays in use",
                    type(ref()).__name__)


def _empty_cuda_cache() -> None:
    """Hand cached CUDA memory back to the device, where torch is in use (never imported here)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 - a broken CUDA setup must not fail the release
        log.warning("torch.cuda.empty_cache() failed: %s", exc)


def _tell_released(lease: Lease) -> None:
    try:
        call(lease.control, "instance_released", lease.body())
    except Exception as exc:  # noqa: BLE001 - the slot expires at the driver anyway
        log.warning("could not tell the driver a stateful UDF instance was released: %s", exc)


# -- the poll thread --------------------------------------------------------------------------
def _ensure_poller(control: ControlInfo) -> None:
    """Start this process's poll thread for ``control``'s driver (called holding ``_cond``)."""
    thread = _pollers.get(control.uri)
    if thread is None or not thread.is_alive():
        thread = threading.Thread(target=_poll_forever, args=(control,), name="streambatch-instance-poll",
                                  daemon=True)
        _pollers[control.uri] = thread
        thread.start()


def _poll_forever(control: ControlInfo) -> None:
    """Long-poll the driver while this process holds instances of it; act on what it says."""
    while True:
        with _cond:
            leases = [lease for lease in _leases.values() if lease.control.uri == control.uri]
            if not leases:
                _forget_poller(control.uri)
                return
            entries = [lease.body(idle=not lease.busy, told=lease.told) for lease in leases if not lease.releasing]
        if not entries:
            with _cond:
                _cond.wait(0.1)
            continue
        try:
            news = call(control, "instance_poll", {"holders": entries, "wait_s": POLL_WAIT_S},
                        wait_s=POLL_WAIT_S).get("release", {})
        except Exception as exc:  # noqa: BLE001 - unreachable or refusing: the driver's slots mean nothing now
            _driver_lost(leases, exc)
            return
        for lease in leases:
            if lease.holder in news:
                _heard(lease, news[lease.holder])


def _heard(lease: Lease, reason: str) -> None:
    with _cond:
        if reason == "wanted":
            lease.told = lease.told or lease.busy
        else:
            lease.must_go = reason
        idle = not lease.busy
    if idle:
        _release(lease, ask=reason == "wanted")


def _driver_lost(leases: list[Lease], exc: Exception) -> None:
    level = logging.WARNING if not isinstance(exc, DriverUnreachableError) else logging.INFO
    log.log(level, "stateful UDF instances released: the driver's control plane is gone (%s)", exc)
    for lease in leases:
        with _cond:
            lease.must_go = "unreachable"
            idle = not lease.busy
        if idle:
            _release(lease, ask=False)
    with _cond:
        _forget_poller(leases[0].control.uri)


def _forget_poller(uri: str) -> None:
    """This thread stops polling (called holding ``_cond``); a newer poller of ``uri`` stays."""
    if _pollers.get(uri) is threading.current_thread():
        del _pollers[uri]
