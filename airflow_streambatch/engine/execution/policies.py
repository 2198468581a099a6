"""The scheduling policy: which operator gets the next slots, and when sources may start.

``AdaptivePolicy`` is the paper's Algorithm 1 (launch, among operators with input,
free slots and output space, the one with the least buffered output) with its
source budget replenished by Algorithm 2 (the estimated rate at which data leaves
the pipeline). ``ConservativePolicy`` launches a task only when its estimated output
fits under the memory limit beside everything buffered and reserved (at the price of
idle slots when memory is tight). Under either policy a running task writes blocks
past its reservation only with a grant (`memory.MemoryGrants`), so an input that
explodes cannot carry memory past the limit; the one exception is a limit too small
for any consumer to run, where the executor writes one block over it and warns.

Policies see operators through `OpView`, a narrow read-only protocol, and implement
`SchedulingPolicy`; the executor asks them and owns the state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from airflow_streambatch.engine.execution.estimates import Estimates
from airflow_streambatch.engine.execution.memory import MemoryBudget


class OpView(Protocol):
    index: int
    is_source: bool
    estimates: Estimates
    buffered_output_bytes: int

    @property
    def probing(self) -> bool: ...  # no task has finished: its output size is unknown
    def has_input(self) -> bool: ...
    def running(self) -> int: ...
    def next_task_output_estimate(self, pessimistic: bool = False) -> float: ...
    def next_task_input_bytes(self) -> int: ...
    def usable_slots(self) -> int: ...


class SchedulingPolicy(Protocol):
    """What the executor asks a policy each turn of its loop."""

    # True: a running task writes past its reservation only with a grant of the block's
    # size, never on the strength of the inputs it frees when it ends (they are still held)
    strict: bool
    # True: an operator's first task runs alone, its output size unknown, until it ends
    probe_alone: bool

    def replenish(self, ops: list[OpView], elapsed_s: float) -> None:
        """Time passed: refill whatever budget limits the sources."""

    def may_launch(self, op: OpView) -> bool:
        """Whether one more task of ``op`` may start now (memory and budget permitting)."""

    def reservation(self, op: OpView) -> float:
        """Bytes to reserve for the next task of ``op``: what it writes without asking."""

    def on_launch(self, op: OpView, reserved: float) -> None:
        """A task of ``op`` started with ``reserved`` bytes reserved."""

    def pick(self, candidates: list[OpView]) -> OpView | None:
        """Which of the operators that may launch gets the free slots."""


@dataclass
class AdaptivePolicy:
    """Algorithms 1 and 2 of the paper."""

    memory: MemoryBudget
    budget: float = field(init=False)
    strict = False  # a task may write as much as its input beside its reservation: it frees that at its end
    # Grants bound what unknown tasks write: probes alone put each first task of a source in a
    # Spark job of its own (the demo's 4 tasks took 4 jobs on 2 slots)
    probe_alone = False

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

    def may_launch(self, op: OpView) -> bool:
        if op.is_source:  # within the budget Algorithm 2 replenishes
            estimate = op.next_task_output_estimate()
            fits = self.memory.used + self.memory.reserved < self.memory.limit
            return fits and self.budget >= min(estimate, self.memory.limit)
        growth = op.next_task_output_estimate() - op.next_task_input_bytes()
        if growth <= 0 or op.buffered_output_bytes == 0:
            return True  # shrinks memory, or nothing of it is buffered: it must run to make progress
        return self.memory.used + self.memory.reserved + growth <= self.memory.limit

    def reservation(self, op: OpView) -> float:
        """A task writes what its reservation covers without asking: its mean estimate,
        never more than is free."""
        return min(op.next_task_output_estimate(), self.memory.room())

    def on_launch(self, op: OpView, reserved: float) -> None:
        if op.is_source:
            self.budget -= reserved

    @staticmethod
    def pick(candidates: list[OpView]) -> OpView | None:
        """Algorithm 1, line 18: least buffered output first (ties: the downstream one)."""
        if not candidates:
            return None
        return min(candidates, key=lambda op: (op.buffered_output_bytes, -op.index))


@dataclass
class ConservativePolicy:
    """Launch only what is estimated to fit, probing unknown operators one task at a time."""

    memory: MemoryBudget
    budget: float = math.inf
    # Never above the limit: a task's input is held until it ends, so writing as much
    # beside its reservation carried W8 #16 76 KiB past its limit.
    strict = True
    probe_alone = True

    def replenish(self, ops, elapsed_s: float) -> None:
        return None

    def may_launch(self, op: OpView) -> bool:
        if op.running() == 0:
            return True  # an idle operator may always start one task: its blocks wait for memory grants
        if op.probing:
            return False  # a probe runs alone until its output size is known
        estimate = op.next_task_output_estimate(pessimistic=True)
        if estimate <= op.next_task_input_bytes():
            return True  # it frees more than it writes: it must run for memory to drain
        return self.memory.used + self.memory.reserved + estimate <= self.memory.limit

    def reservation(self, op: OpView) -> float:
        """The largest output seen (a probe: all that is free), never more than is free."""
        room = self.memory.room()
        return room if op.probing else min(op.next_task_output_estimate(pessimistic=True), room)

    def on_launch(self, op: OpView, reserved: float) -> None:
        return None

    @staticmethod
    def pick(candidates: list[OpView]) -> OpView | None:
        """Downstream first: finishing work frees memory that upstream needs."""
        return max(candidates, key=lambda op: op.index) if candidates else None


def make_policy(name: str, memory: MemoryBudget) -> SchedulingPolicy:
    return AdaptivePolicy(memory) if name == "adaptive" else ConservativePolicy(memory)


def next_operator(operators: list, policy: SchedulingPolicy):
    """The operator a free slot goes to now, if any: the source while the policy lets it
    start tasks, else the one the policy picks among those that could start one."""
    source, rest = operators[0], operators[1:]
    if source.has_input() and policy.may_launch(source) and source.usable_slots() > 0:
        return source
    return policy.pick([op for op in rest if op.runs_tasks and op.has_input()
                        and op.usable_slots() > 0 and policy.may_launch(op)])
