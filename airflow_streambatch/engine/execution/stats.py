"""Per-operator metrics, declared once and used by progress lines and `Dataset.stats()`."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from airflow_streambatch.engine.errors import human_bytes

log = logging.getLogger("airflow_streambatch.engine.progress")


@dataclass
class OpStats:
    name: str
    tasks_launched: int = 0
    tasks_done: int = 0  # distinct tasks that succeeded (a task key counts once, however often it ran)
    tasks_rerun: int = 0  # successful runs of a task that had already succeeded (its output counted once)
    tasks_retried: int = 0  # attempts run again: failed and retried, preempted, or in a Spark job that failed
    blocks_out: int = 0
    rows_out: int = 0  # rows of output blocks; for a writer (fused operators included), rows of its files
    bytes_out: int = 0
    files_out: int = 0  # files a writer staged
    fetched_bytes: int = 0  # input bytes its tasks read from another host
    work_s: float = 0.0
    peak_buffered_bytes: int = 0
    first_launch: float | None = None
    last_finish: float | None = None
    scheduling_overhead_s: float = 0.0
    overhead_per_task_s: float = 0.0
    copies_built: int = 0  # stateful UDF instances (model copies) its tasks built
    build_s: float = 0.0  # seconds spent building them
    build_ahead_s: float = 0.0  # of those, seconds built ahead of the tasks that used them
    starts: int = 0  # Spark partitions launched for it that ran their first tasks
    start_s: float = 0.0  # their time from launch to running task code, summed (job scheduling, Python workers)
    first_start_s: float | None = None  # the first one's: a cold start pays Python worker start-up
    _done_keys: set = field(default_factory=set, repr=False)

    def launched(self, n: int) -> None:
        self.tasks_launched += n
        if self.first_launch is None:
            self.first_launch = time.monotonic()

    def task_done(self, result) -> None:
        """A task succeeded. A writer emits files, not blocks: its rows and bytes are its staged files'."""
        self.work_s += result.work_s
        self.last_finish = time.monotonic()
        self.copies_built += result.builds
        self.build_s += result.build_s
        self.build_ahead_s += result.build_ahead_s
        if result.task_key in self._done_keys:
            self.tasks_rerun += 1
            return
        self._done_keys.add(result.task_key)
        self.tasks_done += 1
        self.blocks_out += len(result.blocks)
        self.rows_out += sum(ref.num_rows for ref in result.blocks)
        self.bytes_out += result.output_bytes
        files = getattr(result, "files", None) or []
        self.files_out += len(files)
        self.rows_out += sum(f.rows for f in files)
        self.bytes_out += sum(f.bytes for f in files)

    def started(self, delay_s: float) -> None:
        """A Spark partition launched for it ran its first tasks ``delay_s`` after the launch."""
        self.starts += 1
        self.start_s += delay_s
        if self.first_start_s is None:
            self.first_start_s = delay_s

    def starts_line(self) -> str | None:
        """Where its cold starts went: Spark partitions to their first task, model copies built."""
        parts = []
        if self.starts:
            parts.append(f"{self.starts} Spark partition(s) started in {1000 * self.start_s / self.starts:.0f} ms "
                         f"on average (the first in {self.first_start_s:.2f} s)")
        if self.copies_built:
            ahead = f" ({self.build_ahead_s:.2f} s of it ahead of their tasks)" if self.build_ahead_s else ""
            parts.append(f"{self.copies_built} model cop{'y' if self.copies_built == 1 else 'ies'} built in "
                         f"{self.build_s:.2f} s{ahead}")
        return f"{self.name}: " + "; ".join(parts) if parts else None

    def retried(self, n: int = 1) -> None:
        self.tasks_retried += n

    def buffered(self, nbytes: int) -> None:
        self.peak_buffered_bytes = max(self.peak_buffered_bytes, nbytes)

    @property
    def wall_s(self) -> float:
        if self.first_launch is None or self.last_finish is None:
            return 0.0
        return self.last_finish - self.first_launch


@dataclass
class RunStats:
    """Statistics of one execution of a plan."""

    ops: list[OpStats] = field(default_factory=list)
    wall_s: float = 0.0
    peak_memory_bytes: int = 0
    launch_log: list[tuple[int, int, int]] = field(default_factory=list)  # (op, tasks, partitions)
    failed_partitions: list = field(default_factory=list)  # PartitionFailure, within max_failed_partitions
    driver_fetched_bytes: int = 0  # output bytes the driver read from executor hosts
    _start: float = 0.0

    def start(self) -> None:
        self._start = time.monotonic()

    def finish(self, states, peak_memory: int) -> None:
        self.wall_s = time.monotonic() - self._start if self._start else 0.0
        self.peak_memory_bytes = peak_memory
        for state in states:
            state.stats.scheduling_overhead_s = state.sizer.overhead_s
            state.stats.overhead_per_task_s = state.sizer.overhead_per_task_s
        self.ops = [state.stats for state in states]

    @property
    def cross_host_bytes(self) -> int:
        """Block bytes that crossed the network between hosts: task inputs and driver reads."""
        return sum(op.fetched_bytes for op in self.ops) + self.driver_fetched_bytes

    def summary(self) -> str:
        lines = [
            f"Execution: {self.wall_s:.2f} s wall, peak buffered {human_bytes(self.peak_memory_bytes)}, "
            f"{len(self.launch_log)} Spark jobs, {human_bytes(self.cross_host_bytes)} of blocks moved between hosts",
            "| operator | tasks | blocks | rows | bytes out | wall s | task s | peak buffered | sched overhead/task |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for failure in self.failed_partitions:
            lines.insert(1, f"FAILED {failure.describe()}")
        starts = [line for op in self.ops if (line := op.starts_line())]
        for op in self.ops:
            lines.append(
                f"| {op.name} | {op.tasks_done} | {op.blocks_out} | {op.rows_out} | {human_bytes(op.bytes_out)} "
                f"| {op.wall_s:.2f} | {op.work_s:.2f} | {human_bytes(op.peak_buffered_bytes)} "
                f"| {op.overhead_per_task_s * 1000:.1f} ms |"
            )
        if starts:
            lines += ["Starts:"] + [f"- {line}" for line in starts]
        return "\n".join(lines)


def progress_line(state, final: bool = False) -> str:
    """One operator's progress: rows, blocks, running tasks, buffered bytes."""
    s = state.stats
    prefix = "done" if final else "running"
    return (
        f"[{prefix}] {s.name}: {s.rows_out} rows, {s.blocks_out} blocks, "
        f"{s.tasks_done} tasks done ({s.tasks_retried} retried), {state.running_tasks} running, "
        f"{human_bytes(state.buffered_output_bytes)} buffered"
    )


def log_progress(operators, final: bool = False) -> None:
    """One progress line per operator, on the progress log (`show_progress`)."""
    for op in operators:
        log.info("%s", progress_line(op, final))


def show_progress() -> None:
    """Show progress on stderr when the application configured no logging at all
    (a script or notebook); under Airflow or any configured app, propagate instead."""
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s streambatch %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
