"""The streaming executor: one loop in the driver that runs a physical plan on Spark.

Each turn of the loop (paper section 4.2): collect finished Spark jobs
(`completion.py`), pass on streamed blocks and grant memory (`memory.py`); replenish
the source budget (Algorithm 2); launch source tasks the budget allows; then hand
free slots to the qualifying operator the policy picks (Algorithm 1, `policies.py`).

Output blocks of the last operator go to ``outputs``, a queue the consumer drains
(``iter_batches``, ``write_*``, ``iter_split``); until consumed they count against
the memory limit, so a slow consumer back-pressures the sources.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
import uuid

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.execution.block_access import BlockAccess
from airflow_streambatch.engine.execution.check_ins import LINGER_S, MAX_JOB_S, CheckIn, Parked
from airflow_streambatch.engine.execution.completion import Completions
from airflow_streambatch.engine.execution.control_server import control_server
from airflow_streambatch.engine.execution.flow import BlockFlow
from airflow_streambatch.engine.execution.launcher import Launcher
from airflow_streambatch.engine.execution.lineage import LineageTable
from airflow_streambatch.engine.execution.liveness import Liveness, fit_blocks_to_memory_limit
from airflow_streambatch.engine.execution.memory import BlockLedger, Heartbeat, MemoryBudget, MemoryGrants
from airflow_streambatch.engine.execution.operators import Operator, build_operators
from airflow_streambatch.engine.execution.operators.map import MapOperator
from airflow_streambatch.engine.execution.partitions import PartitionTracker
from airflow_streambatch.engine.execution.policies import make_policy
from airflow_streambatch.engine.execution.resources import ResourcePool
from airflow_streambatch.engine.execution.stats import RunStats, progress_line
from airflow_streambatch.engine.execution.stream_watcher import StreamWatcher
from airflow_streambatch.engine.output.target import OutputTarget
from airflow_streambatch.engine.plan.logical import WriteFiles
from airflow_streambatch.engine.plan.planner import InputBlocksOp, PhysicalOp, RepartitionOp
from airflow_streambatch.engine.spark.backend import SparkBackend
from airflow_streambatch.engine.spark.profiles import check_stage_scheduling, spark_assigns_gpus
from airflow_streambatch.engine.spark.session import get_spark, ship_package, slots_from_spark, spark_task_slots
from airflow_streambatch.engine.worker.block_room import check_block_room
from airflow_streambatch.engine.worker.blocks import BlockRef, create_run_dir
from airflow_streambatch.engine.worker.task_runner import TaskResult

log = logging.getLogger("airflow_streambatch.engine.progress")

DONE = object()  # the last item on ``outputs`` of a run that finished
CANCEL_WAIT_S = 10.0  # how long a stopped run waits for its cancelled Spark jobs before cleaning up


def _ensure_progress_visible() -> None:
    """Show progress on stderr when the application configured no logging at all
    (a script or notebook); under Airflow or any configured app, propagate instead."""
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s streambatch %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


class StreamingExecutor:
    """Runs one physical plan. Output blocks, then ``DONE`` or the error, arrive on ``outputs``."""

    def __init__(self, ops: list[PhysicalOp], ctx: DataContext | None = None, write_mode: str | None = "append",
                 target: OutputTarget | None = None):
        self.ctx = (ctx or DataContext.get_current()).copy()
        self.ops = ops
        self.run_id = uuid.uuid4().hex[:12]
        self.run_dir = os.path.join(self.ctx.block_dir, f"run-{self.run_id}")
        self.outputs: queue.Queue = queue.Queue()
        self.stats = RunStats()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.heartbeat = Heartbeat()
        self.lineage = LineageTable(ops[0].lineage if isinstance(ops[0], InputBlocksOp) else None)
        sink = ops[-1].transforms[-1] if ops[-1].transforms else None
        self.committer = None
        if isinstance(sink, WriteFiles):
            if target is None:
                raise ValueError(f"a write to {sink.path} runs with its OutputTarget (write_* opens one)")
            self.committer = target.committer(self.run_id, write_mode)
        barriers = sum(isinstance(op, RepartitionOp) for op in ops)  # a write commits per block after the last
        self.partitions = PartitionTracker(self.committer, ops[-1].name, barriers)
        self.skipped: dict = {}
        self.parked = Parked()

    # -- public -----------------------------------------------------------------
    def start(self) -> StreamingExecutor:
        self.spark = get_spark(min_slots=int(sum((self.ctx.resources or {}).values())))
        ship_package(self.spark)
        self.control = control_server(self.spark, self.ctx)
        self.blocks = BlockAccess(self.control.info(self.ctx.control_timeout_s))
        requests = {op.name: op.compute.as_dict() for op in self.ops if op.runs_tasks}
        check_stage_scheduling(self.spark, requests)  # a cluster that cannot place these tasks fails now, by setting
        pool = ResourcePool(self.ctx.resources or slots_from_spark(self.spark, requests.values()),
                            spark_task_slots(self.spark), assign_gpus=not spark_assigns_gpus(self.spark))
        fit_blocks_to_memory_limit(self.ctx)
        local = self.spark.sparkContext.master.startswith("local")  # every block on this host, else on executors'
        check_block_room(self.ctx.block_dir, self.ctx.memory_limit,  # before anything of the run exists
                         block_bytes=None if local else self.ctx.target_max_block_size)
        self.memory = MemoryBudget(self.ctx.memory_limit)
        policy = make_policy(self.ctx.scheduling_policy, self.memory)
        self.operators = build_operators(self.ops, self.ctx, pool)
        for op in self.operators:
            if isinstance(op, MapOperator):
                op.mix_partitions = self.committer is None and self.ctx.max_failed_partitions == 0
            if op.runs_tasks:
                pool.check_feasible(op.compute, op.name)
        self.flow = BlockFlow(self.operators, BlockLedger(self.memory, self.operators, self.blocks), self.partitions,
                              self.outputs)
        self.operators[0].start(self.flow, self.partitions, self.committer, self.skipped)
        self.backend = SparkBackend(self.spark, f"streambatch-{self.run_id}")
        streams = StreamWatcher(self.run_dir, self.control)
        self.grants = MemoryGrants(self.memory, streams, self.operators, self.heartbeat, policy.strict)
        self.policy = policy
        self.launcher = Launcher(self.ctx, self.operators, self.backend, pool, self.memory, policy, self.grants,
                                 self.run_dir, self.run_id, self.stats.launch_log, self.blocks,
                                 host_agents=not self.spark.sparkContext.master.startswith("local"),
                                 label=self.partitions.label)
        self.flow.running_orders = lambda index: [spec.order for launch in self.launcher.launches.values()
                                                  for spec in launch.running(index)]
        self.completions = Completions(self.ctx, self.flow, self.partitions, self.lineage, self.launcher, self.grants)
        self.liveness = Liveness(self.ctx, streams, self.backend, policy)
        create_run_dir(self.ctx.block_dir, self.run_id)
        self.control.start_run(self.run_id)
        self.control.check_ins.open(self.run_id, self.backend.outcomes.put)
        if self.committer is not None:
            self.committer.claim_staging()
        if self.ctx.progress_interval_s:
            _ensure_progress_visible()
        self._thread = threading.Thread(target=self._run, name=f"streambatch-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    def release(self, ref: BlockRef, delete: bool = True) -> None:
        """Called by the consumer once it no longer needs an output block.

        ``delete=False`` keeps the file (materialize) but frees its memory budget.
        """
        self.flow.release(ref, delete)

    def read_output(self, ref: BlockRef):
        """Read an output block in the consumer (driver), from the host that holds it; rebuild
        it by lineage if it is gone."""
        try:
            return self.blocks.read(ref)
        except FileNotFoundError:
            self.lineage.rebuild(ref, self.launcher.run_now, self.flow.ledger.holds, self.blocks)
            return self.blocks.read(ref)

    def shutdown(self) -> None:
        """Stop launching and cancel running jobs (the consumer stopped early)."""
        self._stop.set()
        self.backend.cancel()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self.stats.driver_fetched_bytes = self.blocks.fetched_bytes

    def cleanup(self) -> None:
        """Remove the run's blocks: here, and on every host through its agent."""
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.control.end_run(self.run_id)

    # -- the loop ---------------------------------------------------------------
    def _run(self) -> None:
        error: BaseException | None = None
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            error = exc
        finally:
            self.parked.release_all()
            if error is None:  # partitions told to stop end their jobs on their own
                self._await_jobs(CANCEL_WAIT_S)
            if error is not None or self.launcher.launches:
                self.backend.cancel()
                self._await_jobs(CANCEL_WAIT_S)
                if self.launcher.launches:
                    log.warning("%d Spark job(s) of run %s did not end within %.0f s of being cancelled; their "
                                "staged files are swept by the next write", len(self.launcher.launches), self.run_id,
                                CANCEL_WAIT_S)
            self.control.check_ins.close(self.run_id)
            self.backend.close()
            if self.committer is not None:
                error = self._finish_write(error)
            self.control.end_instances(self.run_id)  # stateful UDF instances are released where they live
            self.stats.finish(self.operators, self.memory.peak)
            self.stats.failed_partitions = list(self.partitions.failures.values())
            if self.ctx.progress_interval_s:
                for op in self.operators:
                    log.info("%s", progress_line(op, final=True))
            self.outputs.put(error if error is not None else DONE)

    def _finish_write(self, error: BaseException | None) -> BaseException | None:
        """Commit what waits to be committed (a table's last batch: its partitions are done,
        whether or not the run failed), record whether the write committed every partition,
        then remove its staging. Returns the run's error, or the flush's."""
        try:
            self.partitions.flush()
        except Exception as exc:  # noqa: BLE001 - the consumer gets it, unless the run failed first
            log.error("the last commit of %s failed: %s", self.committer.path, exc)
            error = error or exc
        try:
            self.committer.finish(error is None and not self.partitions.failures)
        finally:
            self.committer.cleanup()
        return error

    def _await_jobs(self, bound_s: float) -> None:
        """Wait, at most ``bound_s``, for the run's Spark jobs to end, sending partitions that
        check in away: a task that started just before a cancel would otherwise stage files
        after the cleanup removed them."""
        deadline = time.monotonic() + bound_s
        while self.launcher.launches and time.monotonic() < deadline:
            outcome = self.launcher.next_outcome(timeout=0.1)
            if isinstance(outcome, CheckIn):
                outcome.answer([])
            elif outcome is not None:
                self.launcher.launches.pop(outcome.launch_id, None)

    def _loop(self) -> None:
        last_tick = last_progress = time.monotonic()
        self.stats.start()
        while not self._stop.is_set():
            self._collect(timeout=0.02)
            self.grants.follow(self.flow.emit)
            self.completions.check_failures()  # commits can fail partitions too (schema mismatch)
            self.liveness.enforce_timeouts(self.launcher.launches)
            self.liveness.check_stalled(self.operators, self.memory, self.heartbeat)
            if all(op.done for op in self.operators):
                self.flow.release_in_order()  # preserve_order: nothing is pending, every held block goes
                return
            now = time.monotonic()
            if now - last_tick >= self.ctx.budget_update_interval_s:
                self.policy.replenish(self.operators, now - last_tick)
                last_tick = now
            self.flow.advance()
            self._serve_parked()
            self._schedule()
            self.liveness.preempt(self.operators, self.launcher.launches, self.heartbeat)
            if self.ctx.progress_interval_s and now - last_progress >= self.ctx.progress_interval_s:
                last_progress = now
                for op in self.operators:
                    log.info("%s", progress_line(op))
        raise StreamBatchError("execution was stopped before it finished")

    def _schedule(self) -> None:
        """Sources launch as the policy allows; then free slots go to the operator it picks."""
        while (op := self._next_operator()) is not None:
            self.launcher.launch(op)

    def _next_operator(self) -> Operator | None:
        """The operator a free slot goes to now, if any: the source while the policy lets it
        start tasks, else the one the policy picks among those that could start one."""
        source, rest = self.operators[0], self.operators[1:]
        if source.has_input() and self.policy.may_launch(source) and source.usable_slots() > 0:
            return source
        return self.policy.pick([op for op in rest if op.runs_tasks and op.has_input()
                                 and op.usable_slots() > 0 and self.policy.may_launch(op)])

    def _collect(self, timeout: float) -> None:
        if not self.launcher.launches:
            time.sleep(timeout)
            return
        outcome = self.launcher.next_outcome(timeout)
        while outcome is not None:
            self.grants.follow(self.flow.emit, grant=False)  # blocks announced just before the tasks ended
            self.heartbeat.beat()
            if isinstance(outcome, CheckIn):
                self._checked_in(outcome)
            else:
                launch, left, results = self.launcher.finish(outcome)
                self.liveness.job_ended(outcome.launch_id)
                for op, specs in left:
                    mine = None if results is None else results[:len(specs)]
                    results = None if results is None else results[len(specs):]
                    self.completions.tasks_ended(op, specs, mine, outcome.error, launch.timed_out)
            outcome = self.launcher.next_outcome(0)

    def _checked_in(self, check_in: CheckIn) -> None:
        """A Spark partition ran its tasks: pass their results on, then give it more tasks if
        its slot would go to its operator anyway (`check_ins.py`), park it while none is
        ready, or let it end."""
        ended = self.launcher.check_in(check_in)
        if ended is None:  # from an attempt Spark gave up on: its tasks were rerun
            check_in.answer([])
            return
        op, specs, results = ended
        self.completions.tasks_ended(op, specs, results, None if results is not None else StreamBatchError(
            f"Spark lost the partition running them (its executor died) and ran it again, attempt {check_in.attempt}"))
        if any(r.yielded for r in results or []):  # it gave its slot back: the partition ends
            check_in.answer([])
            return
        self.flow.advance()
        self._hand_more(check_in, time.monotonic() + LINGER_S)

    def _serve_parked(self) -> None:
        for check_in, until in self.parked.take():
            self._hand_more(check_in, until)

    def _hand_more(self, check_in: CheckIn, until: float) -> None:
        """Answer a check-in: the next tasks of the operator its slot goes to, when Spark placed
        the partition for that kind of slot; park it while no task is ready (until ``until``);
        else no tasks, and its Spark partition ends."""
        launch = self.launcher.launches.get(check_in.launch_id)
        now = time.monotonic()
        if (launch is None or self._stop.is_set() or launch.timed_out or check_in.launch_id in self.liveness.emptying
                or now - launch.started >= MAX_JOB_S):
            check_in.answer([])
            return
        chosen = self._next_operator()
        if chosen is None and now < until:
            self.parked.park(check_in, until)
            return
        payload, more = None, []
        if chosen is not None and self.launcher.can_run(check_in.launch_id, chosen):
            payload, more = self.launcher.extend(check_in.launch_id, check_in.part, chosen)
        if not check_in.answer(more, payload) and more:  # it stopped waiting: what it was handed runs again
            op, specs = self.launcher.take_back(check_in.launch_id, check_in.part)
            self.completions.tasks_ended(op, specs, [TaskResult.not_run(s.task_key)
                                                     for s in specs])
