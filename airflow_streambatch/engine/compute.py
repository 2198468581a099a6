"""Ray Data's compute strategies (``compute=`` on ``map_batches``, ``map``, ``flat_map``, ``filter``),
mapped onto this engine's ``concurrency``.

Ray runs a function in a pool of tasks and a callable class in a pool of actors. Here both
run in Spark tasks; what carries over is the cap: ``TaskPoolStrategy(size=n)`` is at most
``n`` tasks of the operator at once, and ``ActorPoolStrategy(size=n)`` (or ``max_size=n``) at
most ``n`` live instances of the class (``concurrency=n``, see docs/ray-compatibility.md).
A pool's ``min_size`` and ``initial_size`` are checked as Ray checks them but have no effect:
Spark, not the engine, starts Python workers. Ray's own argument checks and error texts
are kept, so code written against Ray fails here where it fails there.
"""

from __future__ import annotations

import inspect
import logging
import math

log = logging.getLogger("airflow_streambatch.engine")


class ComputeStrategy:
    """Base of `TaskPoolStrategy` and `ActorPoolStrategy` (Ray's ``ray.data.ComputeStrategy``)."""


class TaskPoolStrategy(ComputeStrategy):
    """Tasks for a function; ``size``: at most that many of the operator's tasks at once."""

    def __init__(self, size: int | None = None):
        if size is not None and size < 1:
            raise ValueError("`size` must be >= 1", size)
        self.size = size

    def __eq__(self, other) -> bool:
        return (isinstance(other, TaskPoolStrategy) and self.size == other.size) or (
            other == "tasks" and self.size is None)

    def __hash__(self) -> int:
        return hash(("tasks", self.size))

    def __repr__(self) -> str:
        return f"TaskPoolStrategy(size={self.size})"


class ActorPoolStrategy(ComputeStrategy):
    """A pool of instances of a callable class: ``size=n`` (fixed), or ``min_size``/``max_size``
    (and ``initial_size``). Here ``max_size`` caps the live instances; the rest is checked only.
    ``max_tasks_in_flight_per_actor`` is checked and has no effect (a Spark task holds its
    instance while it runs). ``enable_true_multi_threading=False`` makes ``max_concurrency``
    run the class's calls one at a time, as in Ray."""

    def __init__(self, *, size: int | None = None, min_size: int | None = None, max_size: int | None = None,
                 initial_size: int | None = None, max_tasks_in_flight_per_actor: int | None = None,
                 enable_true_multi_threading: bool | None = None):
        if size is not None:
            if size < 1:
                raise ValueError("size must be >= 1", size)
            if max_size is not None or min_size is not None or initial_size is not None:
                raise ValueError("min_size, max_size, and initial_size cannot be set at the same time as `size`")
            min_size = max_size = initial_size = size
        if min_size is not None and min_size < 1:
            raise ValueError("min_size must be >= 1", min_size)
        if max_size is not None:
            if min_size is None:
                min_size = 1
            if min_size > max_size:
                raise ValueError("min_size must be <= max_size", min_size, max_size)
        if max_tasks_in_flight_per_actor is not None and max_tasks_in_flight_per_actor < 1:
            raise ValueError("max_tasks_in_flight_per_actor must be >= 1, got: ", max_tasks_in_flight_per_actor)
        self.min_size = min_size or 1
        self.max_size = max_size or math.inf
        if initial_size is not None:
            if initial_size < self.min_size:
                raise ValueError(f"initial_size ({initial_size}) must be >= min_size ({self.min_size})")
            if initial_size > self.max_size:
                raise ValueError(f"initial_size ({initial_size}) must be <= max_size ({self.max_size})")
        self.initial_size = initial_size or self.min_size
        self.max_tasks_in_flight_per_actor = max_tasks_in_flight_per_actor
        self.enable_true_multi_threading = enable_true_multi_threading

    def __eq__(self, other) -> bool:
        return isinstance(other, ActorPoolStrategy) and (
            (self.min_size, self.max_size, self.initial_size, self.max_tasks_in_flight_per_actor)
            == (other.min_size, other.max_size, other.initial_size, other.max_tasks_in_flight_per_actor))

    def __hash__(self) -> int:
        return hash(("actors", self.min_size, self.max_size, self.initial_size))

    def __repr__(self) -> str:
        return (f"ActorPoolStrategy(min_size={self.min_size}, max_size={self.max_size}, "
                f"initial_size={self.initial_size}, "
                f"max_tasks_in_flight_per_actor={self.max_tasks_in_flight_per_actor})")


def concurrency_of(where: str, fn, compute, concurrency):
    """The ``concurrency`` that ``compute`` stands for (``concurrency`` itself when no ``compute``).

    As in Ray: a class needs an actor strategy and a function a task strategy (or
    ``"tasks"``/``"actors"``), and ``compute`` wins over ``concurrency`` when both are given.
    """
    if compute is None:
        return concurrency
    is_class = inspect.isclass(fn)
    if is_class and (compute == "tasks" or isinstance(compute, TaskPoolStrategy)):
        raise ValueError(
            f"{where}: ``compute`` must specify an actor compute strategy when using a callable class, but got: "
            f"{compute}. For example, use ``compute=ray.data.ActorPoolStrategy(size=n)``.")
    if not is_class and (compute == "actors" or isinstance(compute, ActorPoolStrategy)):
        raise ValueError(
            f"{where}: ``compute`` is specified as the actor compute strategy: {compute}, but ``fn`` is not a "
            f"callable class: {fn}. Pass a callable class or use the default ``compute`` strategy.")
    if concurrency is not None:
        log.warning("%s: both compute=%r and concurrency=%r given; compute is used, as in Ray",
                    where, compute, concurrency)
    if compute in ("tasks", "actors"):
        return None
    if isinstance(compute, TaskPoolStrategy):
        return compute.size
    if isinstance(compute, ActorPoolStrategy):
        if compute.max_size == math.inf:
            return None
        if compute.min_size == compute.max_size == compute.initial_size:
            return int(compute.max_size)
        return (compute.min_size, int(compute.max_size), compute.initial_size)
    raise ValueError(f"{where}: compute must be 'tasks', 'actors', a TaskPoolStrategy or an ActorPoolStrategy, "
                     f"got {compute!r}")


def udf_threads(where: str, fn, max_concurrency, compute=None) -> int:
    """How many calls of a class's instance a task runs at once: Ray's ``max_concurrency``
    (threads per actor). Ray allows it on actors only; a function is refused, naming it."""
    if max_concurrency is None:
        return 1
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise ValueError(f"{where}: max_concurrency must be an integer >= 1, got {max_concurrency!r}")
    if not inspect.isclass(fn):
        raise ValueError(f"{where}: max_concurrency={max_concurrency} sets threads per actor, so it applies only "
                         "when fn is a callable class; fn is a function")
    if isinstance(compute, ActorPoolStrategy) and compute.enable_true_multi_threading is False:
        return 1
    return max_concurrency


def task_retries(where: str, fn, max_task_retries=None, max_retries=None, max_restarts=None) -> int | None:
    """An operator's own retries of a failed task, from Ray's remote arguments of a map
    (``map_batches(..., max_task_retries=999)``); ``None``: ``DataContext.max_task_retries``.

    Ray retries an actor's tasks ``max_task_retries`` times and a function's ``max_retries``
    times (``-1``: no limit); here either is how often this operator's failed task runs again
    (an exception in ``fn`` or its Python worker dying) before its partition fails. Ray's
    ``max_restarts`` rebuilds a dead actor that many times; here a retried task builds its class
    anew wherever it has none, so ``max_restarts=0`` (with no ``max_task_retries``) means no
    retry for a class, and any other value leaves the retries as they are."""
    for name, value in (("max_task_retries", max_task_retries), ("max_retries", max_retries),
                        ("max_restarts", max_restarts)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < -1):
            raise ValueError(f"{where}: {name} must be an integer >= 0, or -1 for no limit, got {value!r}")
    given = [v for v in (max_task_retries, max_retries) if v is not None]
    if given:
        return -1 if -1 in given else max(given)
    if max_restarts == 0 and inspect.isclass(fn):
        return 0
    return None
