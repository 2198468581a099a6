"""Liveness: no run blocks forever, and every wait has a bound.

Tasks that wait for memory grants keep their Spark slots; when the consumer that
would free the memory has input but no slot, the Spark job of the most upstream
waiting task is emptied (`preempt`). A task past ``task_timeout_s`` has its job
cancelled, which kills its Python worker (`enforce_timeouts`). Waiting for memory
while nothing moves for ``stall_timeout_s`` ends the run with an error that says
what waits for what (`check_stalled`). A limit smaller than two blocks is handled
before the run starts (`fit_blocks_to_memory_limit`). docs/design.md explains why
these make every run finish or fail loudly.
"""

from __future__ import annotations

import logging
import time

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.execution.stats import human_bytes
from airflow_streambatch.engine.execution.stream_watcher import WatchedTask
from airflow_streambatch.engine.protocol.streams import YIELD

log = logging.getLogger("airflow_streambatch.engine.progress")

PREEMPT_AFTER_S = 0.2  # nothing moved for this long while a consumer has no slot: preempt


class Liveness:
    """The executor's guards against hanging; it holds no state but the jobs being emptied."""

    def __init__(self, ctx: DataContext, streams, backend, policy):
        self.ctx = ctx
        self.streams = streams
        self.backend = backend
        self.policy = policy
        self.emptying: set[int] = set()  # launches whose waiting tasks are told to yield their slots

    def job_ended(self, launch_id: int) -> None:
        self.emptying.discard(launch_id)

    def enforce_timeouts(self, launches: dict) -> None:
        """Cancel Spark jobs whose tasks ran past ``task_timeout_s`` (Spark kills their
        Python workers); their outcome comes back as a failed job and is retried."""
        now = time.monotonic()
        for launch_id, launch in launches.items():
            if not launch.timed_out and now > launch.deadline:
                launch.timed_out = True
                log.warning("%s: tasks %s ran past DataContext.task_timeout_s=%ss; cancelling their Spark job",
                            launch.op.name, [s.task_key for s in launch.specs], self.ctx.task_timeout_s)
                self.backend.cancel_launch(launch_id)

    def preempt(self, operators: list, launches: dict, heartbeat) -> None:
        """Give a slot to a consumer that has input but none to run it on, while tasks
        upstream of it hold slots waiting for memory that only the consumer can free.

        The Spark job of the most upstream waiting task is emptied: each of its tasks
        that waits is told to yield (`protocol/streams.YIELD`), stops, and runs again later,
        skipping the blocks it delivered; tasks queued behind them do not start. Slots
        come back when the job ends, so the whole job must end, not one task of it.
        One job at a time, and only after nothing moved for ``PREEMPT_AFTER_S``."""
        waiting = self.streams.waiting()
        for task in waiting:
            if task.stream.launch_id in self.emptying:
                self._yield(task)
        if self.emptying or heartbeat.idle_s() < PREEMPT_AFTER_S:
            return
        for op in reversed(operators):
            if not (op.runs_tasks and op.running_tasks == 0 and op.has_input()
                    and op.usable_slots() == 0 and self.policy.may_launch(op)):
                continue
            victims = [task for task in waiting if task.op_index < op.index]
            if victims:
                launch_id = min(victims, key=lambda task: task.op_index).stream.launch_id
                log.info("%s waits for a slot that tasks waiting for memory hold; preempting Spark job %d of %s",
                         op.name, launch_id, launches[launch_id].op.name)
                self.emptying.add(launch_id)
                for task in waiting:
                    if task.stream.launch_id == launch_id:
                        self._yield(task)
                return

    def _yield(self, task: WatchedTask) -> None:
        self.streams.grant(task, YIELD)
        task.yielding = True

    def check_stalled(self, operators: list, memory, heartbeat) -> None:
        """Fail loudly, never hang: tasks have waited for memory and nothing moved for
        ``stall_timeout_s``. Output waiting for the caller (a paused ``iter_batches``)
        is the caller's pace, not a stall."""
        waiting = self.streams.waiting()
        if not waiting or operators[-1].buffered_output_bytes or heartbeat.idle_s() < self.ctx.stall_timeout_s:
            return
        raise StreamBatchError(stall_report(self.ctx, operators, memory, waiting))


def fit_blocks_to_memory_limit(ctx: DataContext) -> None:
    """A limit smaller than two blocks can only run by writing past it (a block is
    written while the one before it waits for its consumer): cut smaller blocks for
    this run (``ctx`` is the run's copy) and say so, rather than stall."""
    blocks = 2
    if ctx.memory_limit >= blocks * ctx.target_max_block_size:
        return
    target = max(1, ctx.memory_limit // blocks)
    log.warning("DataContext.memory_limit (%s) holds fewer than %d blocks of DataContext.target_max_block_size "
                "(%s): this run cuts blocks of %s. Set target_max_block_size to at most half of "
                "memory_limit to choose it yourself.", human_bytes(ctx.memory_limit), blocks,
                human_bytes(ctx.target_max_block_size), human_bytes(target))
    ctx.target_max_block_size = target
    ctx.target_min_block_size = min(ctx.target_min_block_size, target)


def stall_report(ctx: DataContext, operators, memory, waiting) -> str:
    """What the run is stuck on, for the error that ends a stall instead of a hang."""
    lines = [f"no progress for {ctx.stall_timeout_s:.0f} s (DataContext.stall_timeout_s) while tasks wait for memory "
             f"under DataContext.memory_limit={human_bytes(ctx.memory_limit)}: {human_bytes(memory.used)} of blocks "
             f"held, {human_bytes(memory.reserved)} reserved by running tasks."]
    for op in operators:
        lines.append(f"  {op.name}: {op.running_tasks} running, {len(op.inputs)} block(s) queued, "
                     f"{human_bytes(op.buffered_output_bytes)} of output buffered")
    for task in waiting:
        lines.append(f"  task {task.task_key} of {operators[task.op_index].name} waits to write its block "
                     f"{task.waiting_for} (granted {task.granted}, wrote {human_bytes(task.written)})")
    lines.append("Raise memory_limit, or lower target_max_block_size so that more blocks fit.")
    return "\n".join(lines)
