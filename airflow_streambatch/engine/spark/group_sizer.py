"""How many tasks one Spark partition runs in turn: group scheduling's depth."""

from __future__ import annotations

import math


class GroupSizer:
    """Tasks per Spark partition (the depth of a group), one instance per operator.

    Drizzle amortizes scheduling by putting several tasks in one job. Here partitions
    also check in for more tasks when their group is done (`execution/check_ins.py`), so
    a job's start (about 100 ms in local mode, a second on a cluster) is paid once for
    many groups, and what each further group costs is one check-in: the call and the
    scheduler loop's answer. That cost is measured per check-in (moving average), and the
    depth is the smallest that keeps it under ``bound`` of the group's work:
    ``ceil(check-in overhead / (bound * task_s))``: 1 for tasks of seconds (full
    pipelining), several for 10 ms tasks, at most ``max_size`` and the ready tasks per
    slot, so packing never serializes work another slot could take (W6 once packed 16
    tasks of 2 s onto the one slot that was free). Before a check-in was measured the
    depth is 1: sizing groups by the job overhead put 5 tasks of 2 s into each partition
    of W6's first jobs on a cluster, and a killed executor lost all five.

    Job overheads (wall time minus the busiest partition's work) are still measured, for
    the run's statistics and for task sizing (`operators/map.py`); an operator's first
    job is not counted, as it pays Python worker start-up.
    """

    def __init__(self, bound: float, max_size: int, enabled: bool = True):
        self.bound = bound
        self.max_size = max_size if enabled else 1
        self.job_overhead_s: float | None = None
        self.check_in_overhead_s: float | None = None
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

    def observe_check_in(self, overhead_s: float) -> None:
        """A partition ran a group it got by checking in, taking ``overhead_s`` beyond its tasks' work."""
        prev, overhead_s = self.check_in_overhead_s, max(0.0, overhead_s)
        self.check_in_overhead_s = overhead_s if prev is None else 0.7 * prev + 0.3 * overhead_s

    def depth(self, task_s: float, ready: int, slots: int) -> int:
        """Tasks per partition for its next group: enough to amortize a check-in, but no
        more than this partition's share of the ready tasks over all of the operator's slots."""
        if self.check_in_overhead_s is None or task_s <= 0:
            return 1
        wanted = math.ceil(self.check_in_overhead_s / (self.bound * task_s))
        return max(1, min(self.max_size, wanted, math.ceil(ready / max(1, slots))))

    @property
    def overhead_per_task_s(self) -> float:
        return self.overhead_s / self.tasks if self.tasks else 0.0
