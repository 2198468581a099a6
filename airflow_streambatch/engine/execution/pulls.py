"""Answering check-ins: which tasks a Spark partition that ran its group gets next.

Why partitions pull instead of ending is `check_ins.py`; this is the loop's side. A
partition's results are passed on first, then it gets the next tasks of the operator
its slot would go to anyway, when Spark placed it for that kind of slot; while no task
is ready it is parked (at most ``LINGER_S``), else it gets none and its Spark partition ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.execution.check_ins import LINGER_S, MAX_JOB_S, CheckIn, Parked
from airflow_streambatch.engine.execution.completion import Completions
from airflow_streambatch.engine.execution.flow import BlockFlow
from airflow_streambatch.engine.execution.launcher import Launcher
from airflow_streambatch.engine.execution.liveness import Liveness
from airflow_streambatch.engine.execution.operators import Operator
from airflow_streambatch.engine.protocol.tasks import TaskResult


class PullAnswers:
    """The loop's answers to check-ins. ``next_operator``: the operator a free slot goes to now."""

    def __init__(self, launcher: Launcher, completions: Completions, flow: BlockFlow, liveness: Liveness,
                 next_operator: Callable[[], Operator | None], stopped: threading.Event):
        self.launcher = launcher
        self.completions = completions
        self.flow = flow
        self.liveness = liveness
        self.next_operator = next_operator
        self.stopped = stopped
        self.parked = Parked()

    def checked_in(self, check_in: CheckIn) -> None:
        """A Spark partition ran its tasks: pass their results on, then give it more, park it, or let it end."""
        ended = self.launcher.check_in(check_in)
        if ended is None:  # from an attempt Spark gave up on: its tasks were rerun
            check_in.answer([])
            return
        op, specs, results = ended
        try:
            self.completions.tasks_ended(op, specs, results, None if results is not None else StreamBatchError(
                f"Spark lost the partition running them (its executor died) and ran it again, "
                f"attempt {check_in.attempt}"))
        except BaseException:  # the run failed: the partition ends now, not after CHECK_IN_WAIT_S unanswered
            check_in.answer([])
            raise
        if any(r.yielded for r in results or []):  # it gave its slot back: the partition ends
            check_in.answer([])
            return
        self.flow.advance()
        self.hand_more(check_in, time.monotonic() + LINGER_S)

    def serve_parked(self) -> None:
        for check_in, until in self.parked.take():
            self.hand_more(check_in, until)

    def hand_more(self, check_in: CheckIn, until: float) -> None:
        """Answer a check-in: the next tasks of the operator its slot goes to, when Spark placed
        the partition for that kind of slot; park it while no task is ready (until ``until``);
        else no tasks, and its Spark partition ends."""
        launch = self.launcher.launches.get(check_in.launch_id)
        now = time.monotonic()
        if (launch is None or self.stopped.is_set() or launch.timed_out or check_in.launch_id in self.liveness.emptying
                or now - launch.started >= MAX_JOB_S):
            check_in.answer([])
            return
        chosen = self.next_operator()
        if chosen is None and now < until:
            self.parked.park(check_in, until)
            return
        payload, more = None, []
        if chosen is not None and self.launcher.can_run(check_in.launch_id, chosen):
            payload, more = self.launcher.extend(check_in.launch_id, check_in.part, chosen)
        if not check_in.answer(more, payload) and more:  # it stopped waiting: what it was handed runs again
            op, specs = self.launcher.take_back(check_in.launch_id, check_in.part)
            self.completions.tasks_ended(op, specs, [TaskResult.not_run(s.task_key) for s in specs])

    def await_jobs(self, bound_s: float) -> None:
        """Wait, at most ``bound_s``, for the run's Spark jobs to end, sending partitions that
        check in away: a task that started just before a cancel would otherwise stage files
        after the cleanup removed them."""
        self.parked.release_all()
        deadline = time.monotonic() + bound_s
        while self.launcher.launches and time.monotonic() < deadline:
            outcome = self.launcher.next_outcome(timeout=0.1)
            if isinstance(outcome, CheckIn):
                outcome.answer([])
            elif outcome is not None:
                self.launcher.launches.pop(outcome.launch_id, None)
