"""The streaming executor: runs one physical plan, its scheduler loop in a thread of the driver.

It builds the run's parts (`loop.RunParts`) on a `runtime.Runtime` (the active Spark
application unless one is given), turns the loop (`loop.py`) until every operator is
done, then ends the run: jobs cancelled and awaited, the write committed or not, stats.

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
import uuid

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.execution_resources import limited_memory
from airflow_streambatch.engine.execution.block_access import BlockAccess
from airflow_streambatch.engine.execution.completion import Completions
from airflow_streambatch.engine.execution.flow import BlockFlow
from airflow_streambatch.engine.execution.launcher import Launcher
from airflow_streambatch.engine.execution.lineage import LineageTable
from airflow_streambatch.engine.execution.liveness import Liveness, fit_blocks_to_memory_limit
from airflow_streambatch.engine.execution.loop import RunParts, run_loop
from airflow_streambatch.engine.execution.memory import BlockLedger, Heartbeat, MemoryBudget, MemoryGrants
from airflow_streambatch.engine.execution.operators import build_operators
from airflow_streambatch.engine.execution.operators.map import MapOperator
from airflow_streambatch.engine.execution.operators.sort import SortOperator
from airflow_streambatch.engine.execution.partitions import PartitionTracker
from airflow_streambatch.engine.execution.policies import make_policy, next_operator
from airflow_streambatch.engine.execution.pulls import PullAnswers
from airflow_streambatch.engine.execution.runtime import Runtime, spark_runtime
from airflow_streambatch.engine.execution.stats import RunStats, log_progress, show_progress
from airflow_streambatch.engine.execution.stream_watcher import StreamWatcher
from airflow_streambatch.engine.output.target import OutputTarget
from airflow_streambatch.engine.plan.logical import WriteFiles
from airflow_streambatch.engine.plan.planner import InputBlocksOp, PhysicalOp, RepartitionOp
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.worker.block_room import check_block_room
from airflow_streambatch.engine.worker.blocks import create_run_dir

log = logging.getLogger("airflow_streambatch.engine.progress")

DONE = object()  # the last item on ``outputs`` of a run that finished
CANCEL_WAIT_S = 10.0  # how long a stopped run waits for its cancelled Spark jobs before cleaning up


class StreamingExecutor:
    """Runs one physical plan. Output blocks, then ``DONE`` or the error, arrive on ``outputs``."""

    def __init__(self, ops: list[PhysicalOp], ctx: DataContext | None = None, write_mode: str | None = "append",
                 target: OutputTarget | None = None):
        self.ctx = (ctx or DataContext.get_current()).copy()
        # Ray's resource_limits.object_store_memory caps this run's budget (`execution_resources.py`)
        self.ctx.memory_limit = limited_memory(self.ctx.memory_limit, self.ctx.execution_options.resource_limits)
        self.ops = ops
        self.run_id = uuid.uuid4().hex[:12]
        self.run_dir = os.path.join(self.ctx.block_dir, f"run-{self.run_id}")
        self.outputs: queue.Queue = queue.Queue()
        self.stats = RunStats()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
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

    # -- public -----------------------------------------------------------------
    def start(self, runtime: Runtime | None = None) -> StreamingExecutor:
        """Start the run on ``runtime`` (the active Spark application when None); returns at once."""
        runtime = runtime or spark_runtime(self.ctx, self.ops)
        self.control = runtime.control
        self.blocks = BlockAccess(self.control.info(self.ctx.control_timeout_s))
        fit_blocks_to_memory_limit(self.ctx)
        check_block_room(self.ctx.block_dir, self.ctx.memory_limit,  # before anything of the run exists
                         block_bytes=self.ctx.target_max_block_size if runtime.host_agents else None)
        self.parts = self._assemble(runtime)
        create_run_dir(self.ctx.block_dir, self.run_id)
        self.control.start_run(self.run_id)
        self.control.check_ins.open(self.run_id, self.parts.backend.outcomes.put)
        if self.committer is not None:
            self.committer.claim_staging()
        if self.ctx.progress_interval_s:
            show_progress()
        self._thread = threading.Thread(target=self._run, name=f"streambatch-{self.run_id}", daemon=True)
        self._thread.start()
        return self

    @property
    def operators(self):
        return self.parts.operators

    @property
    def memory(self) -> MemoryBudget:
        return self.parts.memory

    def release(self, ref: BlockRef, delete: bool = True) -> None:
        """Called by the consumer once it no longer needs an output block.

        ``delete=False`` keeps the file (materialize) but frees its memory budget.
        """
        self.parts.flow.release(ref, delete)

    def read_output(self, ref: BlockRef):
        """Read an output block in the consumer (driver), from the host that holds it; rebuild
        it by lineage if it is gone."""
        try:
            return self.blocks.read(ref)
        except FileNotFoundError:
            self.parts.completions.rebuild(ref)
            return self.blocks.read(ref)

    def shutdown(self) -> None:
        """Stop launching and cancel running jobs (the consumer stopped early)."""
        self._stop.set()
        self.parts.backend.cancel()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self.stats.driver_fetched_bytes = self.blocks.fetched_bytes

    def cleanup(self) -> None:
        """Remove the run's blocks: here, and on every host through its agent."""
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.control.end_run(self.run_id)

    # -- the run ----------------------------------------------------------------
    def _assemble(self, runtime: Runtime) -> RunParts:
        """The run's parts, each built with the parts it works with; the backend after the
        checks, so a run refused by one holds nothing to release."""
        ctx, pool, heartbeat = self.ctx, runtime.pool, Heartbeat()
        memory = MemoryBudget(ctx.memory_limit)
        policy = make_policy(ctx.scheduling_policy, memory)
        operators = build_operators(self.ops, ctx, pool)
        for op in operators:
            if isinstance(op, MapOperator):
                op.mix_partitions = self.committer is None and ctx.max_failed_partitions == 0
            if isinstance(op, SortOperator):
                op.read_block = self.read_output  # its boundary search reads the sorted blocks' keys
            if op.runs_tasks:
                pool.check_feasible(op.compute, op.name)
        backend = runtime.backend(f"streambatch-{self.run_id}")
        streams = StreamWatcher(self.run_dir, self.control)
        grants = MemoryGrants(memory, streams, operators, heartbeat, policy.strict)
        launcher = Launcher(ctx, operators, backend, pool, memory, policy, grants, self.run_dir, self.run_id,
                            self.stats.launch_log, self.blocks, host_agents=runtime.host_agents,
                            label=self.partitions.label)
        flow = BlockFlow(operators, BlockLedger(memory, operators, self.blocks), self.partitions, self.outputs,
                         running_orders=launcher.running_orders, silent_tasks=launcher.silent_tasks)
        operators[0].start(flow, self.partitions, self.committer, self.skipped)
        completions = Completions(ctx, flow, self.partitions, self.lineage, launcher, grants, self.blocks)
        liveness = Liveness(ctx, streams, backend, policy)
        pulls = PullAnswers(launcher, completions, flow, liveness, lambda: next_operator(operators, policy), self._stop)
        return RunParts(operators, memory, policy, backend, grants, launcher, flow, completions, liveness, pulls,
                        heartbeat)

    def _run(self) -> None:
        error: BaseException | None = None
        parts = self.parts
        try:
            self.stats.start()
            run_loop(parts, self.ctx, self._stop)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            error = exc
        finally:
            if error is None:  # partitions told to stop end their jobs on their own
                parts.pulls.await_jobs(CANCEL_WAIT_S)
            if error is not None or parts.launcher.launches:
                parts.backend.cancel()
                parts.pulls.await_jobs(CANCEL_WAIT_S)
                if parts.launcher.launches:
                    log.warning("%d Spark job(s) of run %s did not end within %.0f s of being cancelled; their "
                                "staged files are swept by the next write", len(parts.launcher.launches), self.run_id,
                                CANCEL_WAIT_S)
            self.control.check_ins.close(self.run_id)
            parts.grants.streams.close_all()
            parts.backend.close()
            if self.committer is not None:
                error = self.partitions.finish_write(error)
            self.control.end_instances(self.run_id)  # stateful UDF instances are released where they live
            self.stats.finish(parts.operators, parts.memory.peak)
            self.stats.failed_partitions = list(self.partitions.failures.values())
            if self.ctx.progress_interval_s:
                log_progress(parts.operators, final=True)
            self.outputs.put(error if error is not None else DONE)
