"""Stateful UDF instances built ahead of the tasks that use them (`DataContext.build_ahead`).

Why: loading a model takes seconds (minutes on a GPU host), and a task that builds its
instance when its first batch arrives has the load on its critical path. A Spark
partition starts the builds in threads of its Python worker as soon as it starts, so the
load overlaps what comes before the first batch: reading the input, earlier transforms,
earlier operators' tasks.

* a class with a ``concurrency`` cap: under a slot of the cap that is free at that moment
  (`instance_lease.build_ahead`), for the partition's operator and later ones;
* a class without one: every Python worker that runs the operator keeps an instance of
  its own anyway, so it is built here for the partition's own operator only (a worker
  that runs only reads would hold a model it never uses).

A task that needs an instance under construction waits for it, as it would wait for its
own build; a build ahead that fails is built again by the task, which reports the error.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from functools import partial
from typing import Any

from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.worker.instance_lease import build_ahead as build_capped_ahead

log = logging.getLogger("airflow_streambatch.engine.worker")

# (operator uid, gpu ids) -> the build under way or done of an uncapped class, not yet taken by a task
_uncapped: dict[tuple[str, tuple[str, ...]], Future] = {}
_lock = threading.Lock()


def construct(transform) -> Any:
    """A new instance of a stateful UDF class, as the user's constructor arguments make it."""
    return transform.fn(*transform.fn_constructor_args, **transform.fn_constructor_kwargs)


def start_builds(transforms: list, own_op_uids: set[str], control: ControlInfo | None, run_id: str,
                 held: dict) -> None:
    """Start building, in threads of this worker, what ``transforms`` (the planner's choice,
    `launcher._built_ahead`) need; ``held``: the uncapped instances this worker has."""
    for transform in transforms:
        if transform.compute.concurrency is not None:
            build_capped_ahead(transform, control, run_id, partial(construct, transform))
        elif transform.uid in own_op_uids:
            key = (transform.uid, ())
            with _lock:
                if key in held or key in _uncapped:
                    continue
                future = _uncapped[key] = Future()
            threading.Thread(target=_build, args=(transform, future), name="streambatch-build-ahead",
                             daemon=True).start()


def _build(transform, future: Future) -> None:
    start = time.perf_counter()
    try:
        instance = construct(transform)
    except BaseException as exc:  # noqa: BLE001 - the task builds it again and reports the error
        log.warning("%s: building its instance ahead of its first task failed; the task builds it",
                    transform.name, exc_info=True)
        future.set_exception(exc)
        return
    future.set_result((instance, time.perf_counter() - start))


def take_uncapped(key: tuple[str, tuple[str, ...]]) -> tuple[Any, float, float] | None:
    """The instance built ahead for ``key``, once built: (instance, build seconds, seconds
    waited for it); None if none was started, or it failed (the caller builds one)."""
    with _lock:
        future = _uncapped.pop(key, None)
    if future is None:
        return None
    start = time.perf_counter()
    try:
        instance, build_s = future.result()  # as long as building it here would take
    except BaseException:  # noqa: BLE001 - logged by the builder
        return None
    return instance, build_s, time.perf_counter() - start
