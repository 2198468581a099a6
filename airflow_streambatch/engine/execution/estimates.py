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
    input_rows: int = 0
    initial_output_bytes: float = 0.0  # before any task finished (read tasks: input size)
    max_output_bytes: int = 0  # largest output of one task
    max_ratio: float = 0.0  # largest output/input of one task

    def observe(self, work_s: float, input_bytes: int, output_bytes: int, input_rows: int = 0) -> None:
        self.tasks += 1
        self.work_s += work_s
        self.input_bytes += input_bytes
        self.output_bytes += output_bytes
        self.input_rows += input_rows
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

    def for_input(self, rows: int, nbytes: int) -> tuple[float, float]:
        """Expected (seconds of work, output bytes) of a task over ``rows`` rows of
        ``nbytes`` bytes: of the predictions per input row and per input byte, the larger,
        so a cost that follows either one is not underestimated. Only once a task finished."""
        work = output = 0.0
        if self.input_rows:
            work = self.work_s * rows / self.input_rows
            output = self.output_bytes * rows / self.input_rows
        if self.input_bytes:
            work = max(work, self.work_s * nbytes / self.input_bytes)
            output = max(output, self.output_bytes * nbytes / self.input_bytes)
        return work, output
