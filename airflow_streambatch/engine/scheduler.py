"""The scheduling policy: which operator gets the next slots, and when sources may start.

``AdaptivePolicy`` is the paper's Algorithm 1 (launch, among operators with input,
free slots and output space, the one with the least buffered output) with its
source budget replenished by Algorithm 2 (the estimated rate at which data leaves
the pipeline). ``ConservativePolicy`` launches a task only when its estimated output
fits under the memory limit beside everything buffered and reserved (at the price of
idle slots when memory is tight). Under either policy a running task writes blocks
past its reservation only with the executor's grant (`streams.py`), so an input that
explodes cannot carry memory past the limit; the one exception is a limit too small
for any consumer to run, where the executor writes one block over it and warns.

Policies see operators through `OpView`, a narrow read-only protocol; the executor
owns the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Estimates:
    """Online run-time estimates of one operator, from its finished tasks."""

    tasks: int = 0
    work_s: float = 0.0
    input_bytes: int = 0
    output_bytes: int = 0
    initial_output_bytes: float = 0.0  # before any task finished (read tasks: input size)
    max_output_bytes: int = 0  # largest output of one task
    max_ratio: float = 0.0  # largest output/input of one task

    def observe(self, work_s: float, input_bytes: int, output_bytes: int) -> None:
        self.tasks += 1
        self.work_s += work_s
        self.input_bytes += input_bytes
        self.output_bytes += output_bytes
        self.max_output_bytes = max(self.max_output_bytes, output_bytes)
        if input_bytes:
            self.max_ratio = max(self.max_ratio, output_bytes / input_bytes)

    @property
    def known(self) -> bool:
        return self.tasks > 0

    @property
    def task_s(self) -> float:
        return self.work_s / self.tasks if self.tasks else 0.0

    @property
    def output_per_task(self) -> float:
        return self.output_bytes / self.tasks if self.tasks else self.initial_output_bytes

    @property
    def input_per_task(self) -> float:
        return self.input_bytes / self.tasks if self.tasks else 0.0

    def output_for_input(self, input_bytes: int, pessimistic: bool = False) -> float:
        """Expected output of a task given its input bytes: the mean size ratio (or
        per-task mean for sources), or with ``pessimistic`` the largest seen."""
        if self.tasks and self.input_bytes and input_bytes:
            ratio = self.max_ratio if pessimistic else self.output_bytes / self.input_bytes
            return input_bytes * ratio
        if self.tasks:
            return float(self.max_output_bytes) if pessimistic else self.output_per_task
        return max(float(input_bytes), self.initial_output_bytes)


class OpView(Protocol):
    index: int
    is_source: bool
    estimates: Estimates
    buffered_output_bytes: int

    def has_input(self) -> bool: ...
    def running(self) -> int: ...
    def next_task_output_estimate(self, pessimistic: bool = False) -> float: ...
    def next_task_input_bytes(self) -> int: ...
    def usable_slots(self) -> int: ...


@dataclass
class MemoryState:
    limit: int
    used: int = 0  # bytes of blocks produced and not yet released
    reserved: float = 0.0  # estimated output of running tasks
    peak: int = 0


@dataclass
class AdaptivePolicy:
    """Algorithms 1 and 2 of the paper."""

    memory: MemoryState
    budget: float = field(init=False)

    def __post_init__(self):
        self.budget = float(self.memory.limit)

    def replenish(self, ops: list[OpView], elapsed_s: float) -> None:
        """Algorithm 2: add ``outputPartitionSize(source) / P`` per second elapsed."""
        source = ops[0]
        partition = source.estimates.output_per_task
        if not partition:
            return
        seconds_per_partition = 0.0
        alpha = 1.0  # bytes entering op i per byte of source output
        for op in ops[1:]:
            est = op.estimates
            if not est.known or not est.input_per_task:
                continue
            tasks_per_partition = alpha * partition / est.input_per_task
            seconds_per_partition += est.task_s / max(1, op.usable_slots()) * tasks_per_partition
            alpha *= est.output_bytes / est.input_bytes if est.input_bytes else 1.0
        if seconds_per_partition <= 0:
            if len(ops) == 1 or all(op.estimates.known for op in ops[1:]):
                self.budget = float(self.memory.limit)  # nothing downstream consumes: no rate to match
            return
        self.budget = min(float(self.memory.limit), self.budget + partition * elapsed_s / seconds_per_partition)

    def may_launch_source(self, source: OpView) -> bool:
        estimate = source.next_task_output_estimate()
        fits = self.memory.used + self.memory.reserved < self.memory.limit
        return fits and self.budget >= min(estimate, self.memory.limit)

    def on_source_launch(self, estimate: float) -> None:
        self.budget -= estimate

    def has_output_space(self, op: OpView) -> bool:
        growth = op.next_task_output_estimate() - op.next_task_input_bytes()
        if growth <= 0 or op.buffered_output_bytes == 0:
            return True  # shrinks memory, or nothing of it is buffered: it must run to make progress
        return self.memory.used + self.memory.reserved + growth <= self.memory.limit

    @staticmethod
    def pick(candidates: list[OpView]) -> OpView | None:
        """Algorithm 1, line 18: least buffered output first (ties: the downstream one)."""
        if not candidates:
            return None
        return min(candidates, key=lambda op: (op.buffered_output_bytes, -op.index))


@dataclass
class ConservativePolicy:
    """Launch only what is estimated to fit, probing unknown operators one task at a time."""

    memory: MemoryState
    budget: float = math.inf

    def replenish(self, ops, elapsed_s: float) -> None:
        return None

    def _fits(self, op: OpView) -> bool:
        if op.running() == 0:
            return True  # an idle operator may always start one task: its blocks wait for memory grants
        if not op.estimates.known:
            return False  # a probe runs alone until its output size is known
        estimate = op.next_task_output_estimate(pessimistic=True)
        if estimate <= op.next_task_input_bytes():
            return True  # it frees more than it writes: it must run for memory to drain
        return self.memory.used + self.memory.reserved + estimate <= self.memory.limit

    def may_launch_source(self, source: OpView) -> bool:
        return self._fits(source)

    def on_source_launch(self, estimate: float) -> None:
        return None

    def has_output_space(self, op: OpView) -> bool:
        return self._fits(op)

    @staticmethod
    def pick(candidates: list[OpView]) -> OpView | None:
        """Downstream first: finishing work frees memory that upstream needs."""
        return max(candidates, key=lambda op: op.index) if candidates else None


def make_policy(name: str, memory: MemoryState):
    return AdaptivePolicy(memory) if name == "adaptive" else ConservativePolicy(memory)
