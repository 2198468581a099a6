"""How many tasks one Spark partition runs in turn: group scheduling's depth."""

from __future__ import annotations

import math


class GroupSizer:
    """Tasks per Spark partition (the depth of a group), one instance per operator.

    Drizzle amortizes scheduling by putting several tasks in one job. Here a job's
    overhead (wall time minus its longest partition's work) is measured after every
    job (moving average), and the depth is the smallest that keeps that overhead
    under ``bound`` of the partition's work: ``ceil(overhead / (bound * task_s))``.
    Depth 1 for tasks of seconds (full pipelining), up to ``max_size`` for 10 ms tasks.
    Drizzle's AIMD doubling was tried first: one slow first job (worker start-up)
    doubled the depth of 1 s tasks to 4 and left slots idle (W3 ran 30% slower), so
    the first job of an operator is not counted, and depth is capped by the ready
    tasks per slot (W6 once packed 16 tasks of 2 s onto the one slot that was free).
    """

    def __init__(self, bound: float, max_size: int, enabled: bool = True):
        self.bound = bound
        self.max_size = max_size if enabled else 1
        self.job_overhead_s: float | None = None
        self.overhead_s = 0.0
        self.tasks = 0
        self.jobs = 0

    def observe(self, wall_s: float, partition_work_s: list[float], tasks: int) -> None:
        overhead = max(0.0, wall_s - max(partition_work_s, default=0.0))
        self.overhead_s += overhead
        self.tasks += tasks
        self.jobs += 1
        if self.jobs == 1:
            return  # the first job pays Python worker (and executor) start-up: not steady overhead
        prev = self.job_overhead_s
        self.job_overhead_s = overhead if prev is None else 0.7 * prev + 0.3 * overhead

    def depth(self, task_s: float, ready: int, slots: int) -> int:
        """Tasks per partition for the next job: enough to amortize the overhead, but no
        more than this partition's share of the ready tasks over all of the operator's
        slots, so packing never serializes work that other slots could take."""
        if self.job_overhead_s is None or task_s <= 0:
            return 1
        wanted = math.ceil(self.job_overhead_s / (self.bound * task_s))
        return max(1, min(self.max_size, wanted, math.ceil(ready / max(1, slots))))

    @property
    def overhead_per_task_s(self) -> float:
        return self.overhead_s / self.tasks if self.tasks else 0.0
