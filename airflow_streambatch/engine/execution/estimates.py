"""Online run-time estimates of one operator, from its finished tasks (the figures
Algorithm 2 and the memory reservations are computed from)."""

from __future__ import annotations

from dataclasses import dataclass


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
