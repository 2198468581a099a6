"""The streaming executor: one loop in the driver that runs a physical plan on Spark.

Each turn of the loop (paper section 4.2): collect finished Spark jobs, record their
blocks and update estimates; replenish the source budget (Algorithm 2); launch
source tasks the budget allows; then hand free slots to the qualifying operator
with the least buffered output (Algorithm 1). The driver holds `BlockRef`s only;
a block is deleted once the task that consumed it has finished.

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
from collections import deque
from dataclasses import dataclass

from pyspark import cloudpickle

from airflow_streambatch.engine.blocks import BlockRef, create_run_dir, read_block
from airflow_streambatch.engine.commit import PartitionCommitter, check_resumable
from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.errors import PartitionFailure, PartitionsFailedError, StreamBatchError
from airflow_streambatch.engine.failures import (
    disk_full_error,
    job_failure_message,
    root_cause,
    warn_if_block_dir_small,
)
from airflow_streambatch.engine.lineage import LineageTable
from airflow_streambatch.engine.liveness import Liveness, fit_blocks_to_memory_limit
from airflow_streambatch.engine.op_state import OpState, task_key
from airflow_streambatch.engine.partitions import PartitionTracker
from airflow_streambatch.engine.plan import PhysicalOp
from airflow_streambatch.engine.resources import ResourcePool
from airflow_streambatch.engine.scheduler import MemoryState, make_policy
from airflow_streambatch.engine.spark_backend import (
    SparkBackend,
    get_spark,
    ship_package,
    slots_from_spark,
    spark_task_slots,
)
from airflow_streambatch.engine.stats import RunStats, progress_line
from airflow_streambatch.engine.streams import StreamWatcher, WatchedTask, stream_name
from airflow_streambatch.engine.tasks import OperatorPayload, TaskResult, TaskSpec
from airflow_streambatch.engine.transforms import WriteFiles

log = logging.getLogger("airflow_streambatch.engine.progress")


def _ensure_progress_visible() -> None:
    """Show progress on stderr when the application configured no logging at all
    (a script or notebook); under Airflow or any configured app, propagate instead."""
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s streambatch %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


_DONE = object()
NO_CUT = 1 << 62  # repartition tasks emit exactly one block each
STALL_S = 1.0  # nothing moved for this long while tasks wait for memory: grant one block anyway
CANCEL_WAIT_S = 10.0  # how long a stopped run waits for its cancelled Spark jobs before cleaning up


@dataclass
class Launch:
    """One Spark job in flight: its operator, tasks and slots, and its deadline."""

    state: OpState
    specs: list[TaskSpec]
    gpu_ids: list[tuple[str, ...]]
    deadline: float = float("inf")  # task_timeout_s times the tasks one Spark partition runs in turn
    timed_out: bool = False


class StreamingExecutor:
    """Runs one physical plan. Output blocks, then ``_DONE`` or the error, arrive on ``outputs``."""

    def __init__(self, ops: list[PhysicalOp], ctx: DataContext | None = None, write_mode: str = "append"):
        self.ctx = (ctx or DataContext.get_current()).copy()
        self.ops = ops
        self.run_id = uuid.uuid4().hex[:12]
        self.run_dir = os.path.join(self.ctx.block_dir, f"run-{self.run_id}")
        self.outputs: queue.Queue = queue.Queue()
        self.stats = RunStats()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # guards memory accounting shared with consumers
        self._owner: dict[str, int] = {}  # block_id -> producing op index
        self._path_refs: dict[str, int] = {}  # block file -> live references (slices share files)
        self._launches: dict[int, Launch] = {}
        self._attempts: dict[tuple[int, str], int] = {}  # (operator, task key) -> failed runs
        self._delivered: dict[tuple[int, str], set[str]] = {}  # (operator, task key) -> streamed block ids
        self.streams = StreamWatcher(self.run_dir)
        self._last_move = time.monotonic()  # last time a block, a job or a grant moved
        self._over_limit_warned = False
        self.lineage = LineageTable(ops[0].lineage if ops[0].kind == "blocks" else None)
        sink = ops[-1].transforms[-1] if ops[-1].transforms else None
        self.committer = None
        if isinstance(sink, WriteFiles):
            self.committer = PartitionCommitter(sink.path, self.run_id)
            if write_mode == "append" and self.committer.scan():  # beside earlier writes: names of its own
                self.committer.tag = self.run_id
        self.partitions = PartitionTracker(self.committer, ops[-1].name)
        self.skipped: dict = {}

    # -- public -----------------------------------------------------------------
    def start(self) -> StreamingExecutor:
        total_slots = sum((self.ctx.resources or {}).values())
        self.spark = get_spark(min_slots=int(total_slots))
        ship_package(self.spark)
        resources = self.ctx.resources or slots_from_spark(self.spark)
        self.pool = ResourcePool(resources, spark_task_slots(self.spark))
        fit_blocks_to_memory_limit(self.ctx)
        self.memory = MemoryState(self.ctx.memory_limit)
        self.policy = make_policy(self.ctx.scheduling_policy, self.memory)
        self.states = [OpState(i, op, self.ctx, self.pool) for i, op in enumerate(self.ops)]
        for state in self.states:
            state.mix_partitions = self.committer is None and self.ctx.max_failed_partitions == 0
            state.downstream = [d for d in self.states[state.index + 1:] if d.op.runs_tasks]
            if state.op.runs_tasks:
                self.pool.check_feasible(state.op.compute, state.op.name)
        self._plan_source()
        self.backend = SparkBackend(self.spark, f"streambatch-{self.run_id}")
        self.liveness = Liveness(self.ctx, self.streams, self.backend, self.policy)
        create_run_dir(self.ctx.block_dir, self.run_id)
        warn_if_block_dir_small(self.ctx)
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
        self._release(ref, delete)

    def shutdown(self) -> None:
        """Stop launching and cancel running jobs (the consumer stopped early)."""
        self._stop.set()
        self.backend.cancel()

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    # -- setup ------------------------------------------------------------------
    def _plan_source(self) -> None:
        source = self.states[0]
        if source.op.kind == "read":
            read = source.op.read
            slots = max(1, self.pool.slots_for(0, source.op.compute))
            tasks = read.datasource.plan(slots, read.override_num_blocks, self.ctx.target_max_block_size)
            done = self.committer.committed() if self.committer else {}
            if self.committer is not None:
                self.committer.set_reference_schema(self.committer.scan())
            for index, task in enumerate(tasks):
                record = done.get(index)
                if record is None:
                    source.pending_reads.append((index, task))
                    self.partitions.add_read(index, task.label, task.identity)
                else:
                    check_resumable(self.committer.path, index, record, task)
                    self.skipped[index] = record  # committed by an earlier run from the same input
            source.estimates.initial_output_bytes = sum(t.estimated_bytes for t in tasks) / max(1, len(tasks))
        else:  # materialized blocks: already there, owned by someone else (never deleted here)
            for ref in source.op.blocks:
                self._emit(source, ref, owned=False)
        source.upstream_done = True
        self._payloads = {
            s.index: cloudpickle.dumps(OperatorPayload(
                s.index, s.op.name, s.op.transforms, self.run_dir,
                NO_CUT if s.op.kind == "repartition" else self.ctx.target_max_block_size, self.run_id,
            ))
            for s in self.states if s.op.runs_tasks
        }

    # -- the loop ---------------------------------------------------------------
    def _run(self) -> None:
        error: BaseException | None = None
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            error = exc
        finally:
            if error is not None or self._launches:
                self.backend.cancel()
                self._await_cancelled(CANCEL_WAIT_S)
            if self.committer is not None:
                self.committer.cleanup()
            self.stats.finish(self.states, self.memory.peak)
            self.stats.failed_partitions = list(self.partitions.failures.values())
            if self.ctx.progress_interval_s:
                for state in self.states:
                    log.info("%s", progress_line(state, final=True))
            self.outputs.put(error if error is not None else _DONE)

    def _await_cancelled(self, bound_s: float) -> None:
        """Wait, at most ``bound_s``, for cancelled jobs to end: a task that started just
        before the cancel would otherwise stage files after the cleanup removed them."""
        deadline = time.monotonic() + bound_s
        while self._launches and time.monotonic() < deadline:
            try:
                self._launches.pop(self.backend.outcomes.get(timeout=0.1).launch_id, None)
            except queue.Empty:
                pass
        if self._launches:
            log.warning("%d Spark job(s) of run %s did not end within %.0f s of being cancelled; their staged files "
                        "are swept by the next write", len(self._launches), self.run_id, bound_s)

    def _loop(self) -> None:
        last_tick = last_progress = time.monotonic()
        self.stats.start()
        while not self._stop.is_set():
            self._collect(timeout=0.02)
            self._follow_streams()
            self._check_failures()  # commits can fail partitions too (schema mismatch)
            self.liveness.enforce_timeouts(self._launches)
            self.liveness.check_stalled(self.states, self.memory, self._last_move)
            if all(s.done for s in self.states):
                return
            now = time.monotonic()
            if now - last_tick >= self.ctx.budget_update_interval_s:
                self.policy.replenish(self.states, now - last_tick)
                last_tick = now
            self._advance_barriers()
            self._schedule()
            self.liveness.preempt(self.states, self._launches, self._last_move)
            if self.ctx.progress_interval_s and now - last_progress >= self.ctx.progress_interval_s:
                last_progress = now
                for state in self.states:
                    log.info("%s", progress_line(state))
        raise StreamBatchError("execution was stopped before it finished")

    def _schedule(self) -> None:
        while True:
            source = self.states[0]
            if source.has_input() and self.policy.may_launch_source(source) and source.usable_slots() > 0:
                self._launch(source)
                continue
            candidates = [
                s for s in self.states[1:]
                if s.op.runs_tasks and s.has_input() and s.usable_slots() > 0 and self.policy.has_output_space(s)
            ]
            chosen = self.policy.pick(candidates)
            if chosen is None:
                return
            self._launch(chosen)

    def _launch(self, state: OpState) -> None:
        """Launch a group as one Spark job: one partition per free slot, each running up
        to ``sizer.depth`` tasks in turn (never deeper than the ready tasks need)."""
        partitions = state.usable_slots()
        capacity = self.pool.capacity_for(state.op.compute)
        want = partitions * state.sizer.depth(state.estimates.task_s, state.ready_tasks(), capacity)
        specs: list[TaskSpec] = []
        estimates: list[float] = []
        while len(specs) < want and state.has_input():
            alone = bool(state.retry_specs) and state.retry_specs[0].alone
            if specs and (alone or not self._room_for_another(state)):
                break
            estimate = state.next_task_output_estimate(pessimistic=self.ctx.scheduling_policy == "conservative")
            # a task writes what its reservation (and its input's size) covers without asking;
            # more waits for grants, so nothing reserves more than is free
            room = max(0.0, self.memory.limit - self.memory.used - self.memory.reserved)
            conservative_probe = not state.estimates.known and self.ctx.scheduling_policy == "conservative"
            estimate = room if conservative_probe else min(estimate, room)
            specs.append(self._next_spec(state))
            estimates.append(estimate)
            self.memory.reserved += estimate
            if state.is_source:
                self.policy.on_source_launch(estimate)
            if alone or not state.estimates.known:
                break  # a probe runs alone until its size is known; so does a suspect of a failed job
        partitions = min(partitions, len(specs))
        gpu_ids = [self.pool.acquire(state.index, state.op.compute) for _ in range(partitions)]
        launch_id = len(self.stats.launch_log)
        groups: list[list[bytes]] = [[] for _ in range(partitions)]
        previous: list[str | None] = [None] * partitions  # tasks of a partition run one after another
        for i, (spec, estimate) in enumerate(zip(specs, estimates)):
            spec.gpu_ids = gpu_ids[i % partitions]
            spec.stream = stream_name(state.index, spec.task_key, launch_id)
            input_bytes = sum(ref.size_bytes for ref in spec.inputs)
            spec.granted = int((estimate + input_bytes) // state.block_estimate(input_bytes))
            spec.skip_blocks = len(self._delivered.get((state.index, spec.task_key), ()))
            self.streams.watch(WatchedTask(state.index, spec.task_key, spec.stream, spec.granted, estimate,
                                           input_bytes, after=previous[i % partitions]))
            previous[i % partitions] = spec.stream
            groups[i % partitions].append(cloudpickle.dumps(spec))
        state.running_tasks += len(specs)
        state.stats.launched(len(specs))
        self.stats.launch_log.append((state.index, len(specs), partitions))
        depth = -(-len(specs) // partitions)
        timeout = self.ctx.task_timeout_s
        deadline = time.monotonic() + timeout * depth if timeout else float("inf")
        self._launches[launch_id] = Launch(state, specs, gpu_ids, deadline)
        self.backend.submit(launch_id, state.op.name, self._payloads[state.index], groups)

    def _room_for_another(self, state: OpState) -> bool:
        if state.is_source:
            return self.policy.may_launch_source(state)
        return self.policy.has_output_space(state)

    def _next_spec(self, state: OpState) -> TaskSpec:
        if state.retry_specs:
            return state.retry_specs.popleft()
        if state.op.kind == "read":
            index, read_task = state.pending_reads.popleft()
            return TaskSpec(task_key=f"p{index:05d}", partitions=(index,), read_task=read_task)
        inputs = state.take_bundle()
        partitions = tuple(sorted({p for ref in inputs for p in ref.partitions}))
        return TaskSpec(task_key=task_key(inputs), partitions=partitions, inputs=inputs)

    # -- completions ------------------------------------------------------------
    def _collect(self, timeout: float) -> None:
        try:
            outcome = self.backend.outcomes.get(timeout=timeout) if self._launches else None
        except queue.Empty:
            return
        if outcome is None:
            time.sleep(timeout)
            return
        while outcome is not None:
            self._finish_launch(outcome)
            try:
                outcome = self.backend.outcomes.get_nowait()
            except queue.Empty:
                outcome = None

    def _finish_launch(self, outcome) -> None:
        self._follow_streams(grant=False)  # blocks announced just before the job ended
        launch = self._launches.pop(outcome.launch_id)
        state, specs, gpu_ids = launch.state, launch.specs, launch.gpu_ids
        for spec in specs:
            self._unreserve(self.streams.forget(spec.stream).reserved)
        for ids in gpu_ids:
            self.pool.release(state.index, state.op.compute, ids)
        state.running_tasks -= len(specs)
        self.liveness.job_ended(outcome.launch_id)
        self._last_move = time.monotonic()
        if outcome.error is not None:  # a worker crashed, an executor was lost, or the job timed out
            if len(specs) > 1:  # which task is at fault is unknown: run each alone, charging none a try
                log.warning("%s: a Spark job of %d tasks failed (%s); running each task alone to find the one at "
                            "fault", state.op.name, len(specs), root_cause(outcome.error))
                for spec in specs:
                    spec.alone = True
                    state.retry_specs.append(spec)
                return
            spec = specs[0]
            message = job_failure_message(outcome.error, state.op.name, spec.partitions,
                                          self.ctx.task_timeout_s if launch.timed_out else None)
            self._task_failed(state, spec, message, str(outcome.error))
            return
        # results come back partition by partition; spec i ran in partition i % partitions
        partitions = len(gpu_ids)
        order = [i for p in range(partitions) for i in range(p, len(specs), partitions)]
        results: list[TaskResult] = [None] * len(specs)
        for i, blob in zip(order, outcome.results):
            results[i] = cloudpickle.loads(blob)
        per_partition_work = [0.0] * partitions
        for i, result in enumerate(results):
            per_partition_work[i % partitions] += result.work_s
        state.sizer.observe(outcome.wall_s, per_partition_work, len(specs))
        for spec, result in zip(specs, results):
            if result.yielded:  # gave its slot back while waiting for memory: runs again, charged nothing
                state.retry_specs.append(spec)
                continue
            if result.no_space is not None:
                raise disk_full_error(result.no_space, self.ctx, state.op.name, spec.partitions)
            if result.lost_inputs:
                self._recover_inputs(state, spec, result.lost_inputs)
            elif result.error is not None:
                self._task_failed(state, spec, result.error, result.error_traceback)
            else:
                self._task_succeeded(state, spec, result)
        self._propagate_done()

    def _task_succeeded(self, state: OpState, spec: TaskSpec, result: TaskResult) -> None:
        state.estimates.observe(result.work_s, result.input_bytes, result.output_bytes)
        state.stats.task_done(result)
        self.lineage.register(state.op.name, self._payloads[state.index], spec.for_replay(), result.blocks)
        self.partitions.add_files(spec.partitions, result.files)
        streamed = self._delivered.pop((state.index, spec.task_key), set())
        for ref in result.blocks:
            if ref.block_id not in streamed:
                self._emit(state, ref)
        for ref in spec.inputs:
            self._release(ref)
        if spec.read_task is not None:
            self.partitions.read_done(spec.partitions[0])

    def _task_failed(self, state: OpState, spec: TaskSpec, error: str, remote_traceback: str) -> None:
        """Retry a failed task up to ``max_task_retries`` times, then fail its input partition."""
        key = (state.index, spec.task_key)
        self._attempts[key] = self._attempts.get(key, 0) + 1
        if self._attempts[key] <= self.ctx.max_task_retries and not self.partitions.is_failed(spec.partitions):
            log.warning("%s: task %s (input partitions %s) failed, retry %d of %d: %s", state.op.name,
                        spec.task_key, spec.partitions, self._attempts[key], self.ctx.max_task_retries, error)
            state.retry_specs.append(spec)
            return
        # fail the partitions before releasing the task's inputs: a partition whose last
        # block is released is committed, and a failed one must never be
        for p in spec.partitions:
            self.partitions.fail(PartitionFailure(p, self.partitions.label(p), state.op.name, error, remote_traceback))
        for ref in spec.inputs:
            self._release(ref)
        self._delivered.pop(key, None)
        for p in spec.partitions:
            self._drop_partition(p)
        self._check_failures()

    def _check_failures(self) -> None:
        failures = list(self.partitions.failures.values())
        if len(failures) > self.ctx.max_failed_partitions:
            raise PartitionsFailedError(failures, self.ctx.max_failed_partitions)

    def _drop_partition(self, partition: int) -> None:
        """A failed partition: its queued blocks and pending work are dropped, never committed."""
        for state in self.states:
            state.pending_reads = deque((i, t) for i, t in state.pending_reads if i != partition)
            dropped = [ref for ref in state.inputs if partition in ref.partitions]
            dropped += [ref for spec in state.retry_specs if partition in spec.partitions for ref in spec.inputs]
            state.inputs = deque(ref for ref in state.inputs if partition not in ref.partitions)
            state.retry_specs = deque(spec for spec in state.retry_specs if partition not in spec.partitions)
            for ref in dropped:
                self._release(ref)

    def _recover_inputs(self, state: OpState, spec: TaskSpec, lost: list[str]) -> None:
        """Inputs of ``spec`` vanished: rebuild them by lineage, then run the task again."""
        key = (state.index, f"lost:{spec.task_key}")
        self._attempts[key] = self._attempts.get(key, 0) + 1
        if self._attempts[key] > 3:
            raise StreamBatchError(f"{state.op.name}: inputs of task {spec.task_key} keep disappearing: {lost}")
        for ref in spec.inputs:
            if ref.block_id in lost:
                self.lineage.rebuild(ref, self._run_now, lambda path: path in self._path_refs)
        state.retry_specs.append(spec)

    def _run_now(self, op_blob: bytes, spec: TaskSpec) -> TaskResult:
        return cloudpickle.loads(self.backend.run_now(op_blob, cloudpickle.dumps(spec)))

    def read_output(self, ref: BlockRef):
        """Read an output block in the consumer (driver); rebuild it by lineage if its file is gone."""
        try:
            return read_block(ref)
        except FileNotFoundError:
            self.lineage.rebuild(ref, self._run_now, lambda path: path in self._path_refs)
            return read_block(ref)

    # -- streamed blocks and memory grants -----------------------------------------
    def _follow_streams(self, grant: bool = True) -> None:
        """Pass on the blocks running tasks announced, then grant memory to tasks waiting
        for it, most downstream first (they free memory soonest). A task that says it is
        done gives back what it reserved and did not write. When nothing has moved for
        ``STALL_S`` (no block, no finished task, no grant) while tasks wait, no block waits
        for the consumer and no task that can write holds a reservation, the memory is
        taken by inputs that only waiting tasks can free (a limit smaller than what the
        operators need at once): grant one block over the limit rather than deadlock."""
        now = time.monotonic()
        for task, ref in self.streams.poll():
            self._delivered.setdefault((task.op_index, task.task_key), set()).add(ref.block_id)
            taken = min(task.reserved, ref.size_bytes)  # the block now counts as used, not reserved
            task.reserved -= taken
            self._unreserve(taken)
            self._emit(self.states[task.op_index], ref)
            self._last_move = now
        for task in self.streams.tasks.values():
            if task.finished and task.reserved:
                self._unreserve(task.reserved)
                task.reserved = 0
                self._last_move = now
        if not grant:
            return
        waiting = self.streams.waiting()
        idle = sum(task.reserved for task in waiting)  # a waiting task writes nothing until granted
        for task in waiting:
            need = max(float(self.states[task.op_index].block_estimate(task.input_bytes)), task.reserved)
            frees_as_much = task.written + need <= task.input_bytes
            if frees_as_much or self.memory.used + (self.memory.reserved - idle) + need <= self.memory.limit:
                idle -= task.reserved
                self.memory.reserved += need - task.reserved
                task.reserved = need
                self.streams.grant(task, task.waiting_for + 1)
                self._last_move = now
        waiting = self.streams.waiting()
        # tasks queued behind a waiting one keep their reservation (it lets them write without
        # asking) but cannot use it before that one moves
        writing = self.memory.reserved - sum(task.reserved for task in self.streams.held_back(waiting))
        if (waiting and now - self._last_move > STALL_S and writing < 1
                and self.states[-1].buffered_output_bytes == 0):
            if not self._over_limit_warned:
                log.warning("tasks wait for memory under memory_limit (%d bytes) that only waiting tasks can "
                            "free; writing one block over the limit to make progress. "
                            "Raise DataContext.memory_limit or lower target_max_block_size.", self.memory.limit)
                self._over_limit_warned = True
            self.streams.grant(waiting[0], waiting[0].waiting_for + 1)
            self._last_move = now

    def _unreserve(self, nbytes: float) -> None:
        self.memory.reserved = max(0.0, self.memory.reserved - nbytes)

    # -- block flow -------------------------------------------------------------
    def _emit(self, state: OpState, ref: BlockRef, owned: bool = True) -> None:
        """A block produced by ``state``: account it and pass it downstream."""
        with self._lock:
            if owned:
                self._owner[ref.block_id] = state.index
                self._path_refs[ref.path] = self._path_refs.get(ref.path, 0) + 1
                state.largest_block = max(state.largest_block, ref.size_bytes)
                state.buffered_output_bytes += ref.size_bytes
                self.memory.used += ref.size_bytes
                self.memory.peak = max(self.memory.peak, self.memory.used)
                state.stats.buffered(state.buffered_output_bytes)
        if state.cut or self.partitions.is_failed(ref.partitions):
            self._release(ref)
        else:
            self._deliver(state.index + 1, ref)

    def _deliver(self, index: int, ref: BlockRef) -> None:
        if index == len(self.states):
            self.outputs.put(ref)
            return
        state = self.states[index]
        if state.op.kind != "limit":
            self.partitions.hold(ref)
            state.inputs.append(ref)
            return
        remaining = state.op.limit - state.rows_seen
        if remaining <= 0:
            self._release(ref)
            return
        if ref.num_rows > remaining:
            part = ref.slice(0, remaining)
            self._retarget(ref, part)
            ref = part
        state.rows_seen += ref.num_rows
        state.stats.rows_out += ref.num_rows
        self._deliver(index + 1, ref)
        if state.rows_seen >= state.op.limit:
            self._cut_upstream(index)

    def _retarget(self, whole: BlockRef, part: BlockRef) -> None:
        """A block replaced by a slice of it: move its ownership and bytes to the slice."""
        with self._lock:
            owner = self._owner.pop(whole.block_id, None)
            if owner is None:
                return
            self._owner[part.block_id] = owner
            freed = whole.size_bytes - part.size_bytes
            self.states[owner].buffered_output_bytes -= freed
            self.memory.used -= freed

    def _cut_upstream(self, limit_index: int) -> None:
        """The limit is reached: nothing upstream of it needs to run any more."""
        for state in self.states[:limit_index]:
            state.cut = True
            state.pending_reads.clear()
            state.groups.clear()
            while state.inputs:
                self._release(state.inputs.popleft())
        self.states[limit_index].upstream_done = True

    def _release(self, ref: BlockRef, delete: bool = True) -> None:
        self.partitions.drop(ref)
        with self._lock:
            owner = self._owner.pop(ref.block_id, None)
            if owner is None:
                return
            self.states[owner].buffered_output_bytes -= ref.size_bytes
            self.memory.used -= ref.size_bytes
            left = self._path_refs.get(ref.path, 1) - 1
            if left > 0:
                self._path_refs[ref.path] = left
                return
            self._path_refs.pop(ref.path, None)
        if not delete:
            return
        try:
            os.remove(ref.path)
        except FileNotFoundError:
            pass

    def _propagate_done(self) -> None:
        for upstream, state in zip(self.states, self.states[1:]):
            if upstream.done:
                state.upstream_done = True

    def _advance_barriers(self) -> None:
        """Repartition: once all its input is in, cut it into ``num_blocks`` row ranges.

        The ranges are slices of the input blocks (no data moves in the driver); each
        becomes one task that writes one block. The input blocks are released when
        the last of those tasks is done, since ranges share them.
        """
        self._propagate_done()
        for state in self.states:
            if state.op.kind != "repartition":
                continue
            if state.upstream_done and state.inputs and not state.barrier_blocks:
                state.barrier_blocks = list(state.inputs)
                state.inputs.clear()
                total = sum(ref.num_rows for ref in state.barrier_blocks)
                n = state.op.num_blocks
                bounds = [round(i * total / n) for i in range(n + 1)]
                state.groups.extend(g for g in _slice_rows(state.barrier_blocks, bounds) if g)
            if state.barrier_blocks and not state.groups and state.running_tasks == 0:
                for ref in state.barrier_blocks:
                    self._release(ref)
                state.barrier_blocks = []
        self._propagate_done()

    # -- cleanup ----------------------------------------------------------------
    def cleanup(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _slice_rows(blocks: list[BlockRef], bounds: list[int]) -> list[list[BlockRef]]:
    """For each output range [bounds[i], bounds[i+1]), the block slices that cover it."""
    groups: list[list[BlockRef]] = [[] for _ in bounds[:-1]]
    start = 0
    for ref in blocks:
        end = start + ref.num_rows
        for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            a, b = max(lo, start), min(hi, end)
            if a < b:
                groups[i].append(ref.slice(a - start, b - a))
        start = end
    return groups
