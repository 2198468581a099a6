"""Execution slots: CPU, GPU and custom labels, handed out by the driver's scheduler.

Spark's own scheduler sees only task slots; this pool is what enforces "4 CPU and 2
GPU slots" across operators, caps each operator's concurrency, and, in local mode
where Spark cannot, assigns GPU ids to tasks. It also counts Spark task slots: every
Spark partition the driver launches takes one, so a fractional ``num_cpus`` never
launches more partitions than Spark runs at once. A partition queued inside Spark
would hold its reservation without running, hiding a stall from the driver.
"""

from __future__ import annotations

import math

from airflow_streambatch.engine.plan.logical import ResourceRequest


TASK_SLOTS = "spark task slots"  # a key of ``keep``: Spark partitions to leave free


class ResourcePool:
    def __init__(self, totals: dict[str, float], task_slots: int | None = None):
        self.totals = {k: float(v) for k, v in totals.items()}
        self.used = {k: 0.0 for k in self.totals}
        self.task_slots = task_slots  # Spark tasks that run at once; None: not counted
        self.tasks_running = 0
        self.running: dict[int, int] = {}  # operator index -> tasks holding slots
        self._free_gpus = [str(i) for i in range(int(self.totals.get("GPU", 0)))]

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

    def slots_for(self, op: int, compute: ResourceRequest, keep: dict[str, float] | None = None) -> int:
        """How many more tasks of operator ``op`` fit now (at most its concurrency running),
        leaving ``keep`` (amounts per resource, and `TASK_SLOTS`) free for other operators."""
        keep = keep or {}
        fit = min(
            (int((self.totals[name] - self.used[name] - keep.get(name, 0.0)) // amount + 1e-9)
             for name, amount in compute.resources),
            default=0,
        )
        if self.task_slots is not None:
            fit = min(fit, self.task_slots - self.tasks_running - int(keep.get(TASK_SLOTS, 0)))
        if compute.concurrency is not None:
            fit = min(fit, compute.concurrency - self.running.get(op, 0))
        return max(0, fit)

    def capacity_for(self, compute: ResourceRequest) -> int:
        """Tasks of this request that fit in the whole pool (at most its concurrency)."""
        fit = min((int(self.totals.get(name, 0) // amount + 1e-9) for name, amount in compute.resources), default=0)
        return min(fit, compute.concurrency) if compute.concurrency is not None else fit

    def acquire(self, op: int, compute: ResourceRequest) -> tuple[str, ...]:
        """Take one task's slots; returns the GPU ids assigned to it (local mode)."""
        for name, amount in compute.resources:
            self.used[name] += amount
        self.running[op] = self.running.get(op, 0) + 1
        self.tasks_running += 1
        gpus = math.ceil(dict(compute.resources).get("GPU", 0))
        taken, self._free_gpus = self._free_gpus[:gpus], self._free_gpus[gpus:]
        return tuple(taken)

    def release(self, op: int, compute: ResourceRequest, gpu_ids: tuple[str, ...]) -> None:
        for name, amount in compute.resources:
            self.used[name] -= amount
        self.running[op] -= 1
        self.tasks_running -= 1
        self._free_gpus.extend(gpu_ids)
