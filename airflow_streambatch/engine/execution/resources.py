"""Execution slots: CPU, GPU and custom labels, handed out by the driver's scheduler.

Spark's own scheduler sees only task slots; this pool is what enforces "4 CPU and 2
GPU slots" across operators, caps each operator's concurrency, and, in local mode
where Spark cannot, assigns GPU ids to tasks. On clusters Spark assigns them
(stage-level scheduling, `spark/profiles.py`), so the pool counts GPU slots but
hands out no ids: a driver-made id means nothing on an executor's host. It also counts
Spark task slots: every Spark partition the driver launches takes one, so a fractional
``num_cpus`` never launches more partitions than Spark runs at once. A partition queued
inside Spark would hold its reservation without running, hiding a stall from the driver.
"""

from __future__ import annotations

import math

from airflow_streambatch.engine.plan.logical import ResourceRequest


TASK_SLOTS = "spark task slots"  # a key of ``keep``: Spark partitions to leave free
_EPS = 1e-9  # float slack: four shares of 0.25 fill a GPU exactly


class ResourcePool:
    def __init__(self, totals: dict[str, float], task_slots: int | None = None, assign_gpus: bool = True):
        """``assign_gpus``: hand out GPU ids (local mode); ``False`` where Spark assigns them (clusters)."""
        self.totals = {k: float(v) for k, v in totals.items()}
        self.used = {k: 0.0 for k in self.totals}
        self.task_slots = task_slots  # Spark tasks that run at once; None: not counted
        self.tasks_running = 0
        self.running: dict[int, int] = {}  # operator index -> tasks holding slots
        gpus = int(self.totals.get("GPU", 0)) if assign_gpus else 0
        self._gpu_free = {str(i): 1.0 for i in range(gpus)}  # GPU id -> share not yet handed out

    def check_feasible(self, compute: ResourceRequest, operator: str) -> None:
        """Fail before running when a task can never get its slots, naming the setting."""
        for name, amount in compute.resources:
            have = self.totals.get(name, 0.0)
            if amount > have:
                raise ValueError(
                    f"{operator} asks for {name}={amount:g} per task but only {have:g} {name} "
                    f"slot(s) exist; set DataContext.get_current().resources (e.g. "
                    f"{{'CPU': 4, {name!r}: {max(1, math.ceil(amount))}}}) or the Spark executor resources"
                )

    def _free(self, name: str) -> float:
        return self.totals.get(name, 0.0) - self.used.get(name, 0.0)

    def slots_for(self, op: int, compute: ResourceRequest, keep: dict[str, float] | None = None) -> int:
        """How many more tasks of operator ``op`` fit now (at most its concurrency running),
        leaving ``keep`` (amounts per resource, and `TASK_SLOTS`) free for other operators.
        A resource the pool does not have fits no task (it is not an error: `check_feasible` reports it)."""
        keep = keep or {}
        fit = min(
            (int((self._free(name) - keep.get(name, 0.0)) // amount + _EPS) for name, amount in compute.resources),
            default=0,
        )
        if self.task_slots is not None:
            fit = min(fit, self.task_slots - self.tasks_running - int(keep.get(TASK_SLOTS, 0)))
        if compute.concurrency is not None:
            fit = min(fit, compute.concurrency - self.running.get(op, 0))
        return max(0, fit)

    def capacity_for(self, compute: ResourceRequest) -> int:
        """Tasks of this request that fit in the whole pool (at most its concurrency)."""
        fit = min((int(self.totals.get(name, 0) // amount + _EPS) for name, amount in compute.resources), default=0)
        return min(fit, compute.concurrency) if compute.concurrency is not None else fit

    def acquire(self, op: int, compute: ResourceRequest) -> tuple[str, ...]:
        """Take one task's slots; returns the GPU ids assigned to it (local mode, else ``()``)."""
        for name, amount in compute.resources:
            self.used[name] = self.used.get(name, 0.0) + amount
        self.running[op] = self.running.get(op, 0) + 1
        self.tasks_running += 1
        return self._take_gpus(dict(compute.resources).get("GPU", 0.0))

    def _take_gpus(self, amount: float) -> tuple[str, ...]:
        """A share of one GPU for ``amount`` < 1 (tasks of 0.25 share a GPU four at a time,
        filling one before starting the next, so whole GPUs stay free for whole-GPU tasks);
        else ``ceil(amount)`` whole free GPUs."""
        if not amount or not self._gpu_free:
            return ()
        if amount < 1:
            fits = [gpu for gpu, free in self._gpu_free.items() if free + _EPS >= amount]
            if not fits:
                return ()
            gpu = min(fits, key=lambda g: (self._gpu_free[g], int(g)))  # the fullest that still fits
            self._gpu_free[gpu] -= amount
            return (gpu,)
        whole = [gpu for gpu, free in self._gpu_free.items() if free >= 1 - _EPS][: math.ceil(amount)]
        if len(whole) < math.ceil(amount):
            return ()
        for gpu in whole:
            self._gpu_free[gpu] = 0.0
        return tuple(whole)

    def release(self, op: int, compute: ResourceRequest, gpu_ids: tuple[str, ...]) -> None:
        for name, amount in compute.resources:
            self.used[name] = self.used.get(name, 0.0) - amount
        self.running[op] -= 1
        self.tasks_running -= 1
        amount = dict(compute.resources).get("GPU", 0.0)
        share = amount if amount < 1 else 1.0
        for gpu in gpu_ids:
            if gpu in self._gpu_free:
                self._gpu_free[gpu] = min(1.0, self._gpu_free[gpu] + share)
