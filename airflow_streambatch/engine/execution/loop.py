"""The scheduler loop: one thread in the driver that runs a physical plan's tasks.

Each turn (paper section 4.2): collect finished jobs and check-ins (`completion.py`,
`pulls.py`), pass on streamed blocks and grant memory (`memory.py`); replenish the
source budget (Algorithm 2); launch source tasks the budget allows; then hand free
slots to the qualifying operator the policy picks (Algorithm 1, `policies.py`).

Every part it turns is in one `RunParts`, built once by the executor; the loop owns
them while it runs (the consumer's thread only reads outputs and releases blocks).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.execution.check_ins import CheckIn
from airflow_streambatch.engine.execution.completion import Completions
from airflow_streambatch.engine.execution.flow import BlockFlow
from airflow_streambatch.engine.execution.launcher import Launcher
from airflow_streambatch.engine.execution.liveness import Liveness
from airflow_streambatch.engine.execution.memory import Heartbeat, MemoryBudget, MemoryGrants
from airflow_streambatch.engine.execution.operators import Operator
from airflow_streambatch.engine.execution.policies import SchedulingPolicy, next_operator
from airflow_streambatch.engine.execution.pulls import PullAnswers
from airflow_streambatch.engine.execution.stats import log_progress
from airflow_streambatch.engine.protocol.backend import Backend


@dataclass
class RunParts:
    """The state of one run, in one place: each part was built with the others it works with."""

    operators: list[Operator]
    memory: MemoryBudget
    policy: SchedulingPolicy
    backend: Backend
    grants: MemoryGrants
    launcher: Launcher
    flow: BlockFlow
    completions: Completions
    liveness: Liveness
    pulls: PullAnswers
    heartbeat: Heartbeat


def run_loop(parts: RunParts, ctx: DataContext, stopped: threading.Event) -> None:
    """Turn until every operator is done; raises when ``stopped`` is set first, or what failed the run."""
    last_tick = last_progress = time.monotonic()
    while not stopped.is_set():
        _collect(parts, timeout=0.02)
        parts.grants.follow(parts.flow.emit)
        parts.completions.check_failures()  # commits can fail partitions too (schema mismatch)
        parts.liveness.enforce_timeouts(parts.launcher.launches)
        parts.liveness.check_stalled(parts.operators, parts.memory, parts.heartbeat)
        if all(op.done for op in parts.operators):
            parts.flow.release_in_order()  # preserve_order: nothing is pending, every held block goes
            return
        now = time.monotonic()
        if now - last_tick >= ctx.budget_update_interval_s:
            parts.policy.replenish(parts.operators, now - last_tick)
            last_tick = now
        parts.flow.advance()
        parts.pulls.serve_parked()
        while (op := next_operator(parts.operators, parts.policy)) is not None:  # free slots, to whom the policy says
            parts.launcher.launch(op)
        parts.liveness.preempt(parts.operators, parts.launcher.launches, parts.heartbeat)
        if ctx.progress_interval_s and now - last_progress >= ctx.progress_interval_s:
            last_progress = now
            log_progress(parts.operators)
    raise StreamBatchError("execution was stopped before it finished")


def _collect(parts: RunParts, timeout: float) -> None:
    """Everything the backend reported: check-ins answered, ended jobs' tasks passed on."""
    if not parts.launcher.launches:
        time.sleep(timeout)
        return
    outcome = parts.launcher.next_outcome(timeout)
    while outcome is not None:
        parts.grants.follow(parts.flow.emit, grant=False)  # blocks announced just before the tasks ended
        parts.heartbeat.beat()
        if isinstance(outcome, CheckIn):
            parts.pulls.checked_in(outcome)
        else:
            launch, left, results = parts.launcher.finish(outcome)
            parts.liveness.job_ended(outcome.launch_id)
            for op, specs in left:
                mine = None if results is None else results[:len(specs)]
                results = None if results is None else results[len(specs):]
                parts.completions.tasks_ended(op, specs, mine, outcome.error, launch.timed_out)
        outcome = parts.launcher.next_outcome(0)
