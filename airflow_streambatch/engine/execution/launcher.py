"""Launches: packing an operator's next tasks into one Spark job, feeding its partitions
more as they check in, and unpacking what comes back.

A launch takes one Spark partition per usable slot, each running up to
``sizer.depth`` tasks in turn (group scheduling, `spark/group_sizer.py`), then asking
for more (`check_ins.py`). Each task gets a memory reservation the policy sizes, its
slot's GPU ids, and an output stream the driver watches (`memory.MemoryGrants`): its
`protocol.tasks.Placement`, set on a copy of the frozen spec, so a retry starts clean.
"""

from __future__ import annotations

import inspect
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark import cloudpickle

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.execution.block_access import BlockAccess
from airflow_streambatch.engine.execution.check_ins import CheckIn
from airflow_streambatch.engine.execution.memory import MemoryBudget, MemoryGrants
from airflow_streambatch.engine.execution.operators import Operator
from airflow_streambatch.engine.execution.policies import SchedulingPolicy
from airflow_streambatch.engine.execution.resources import ResourcePool
from airflow_streambatch.engine.execution.serializability import pickled_operator
from airflow_streambatch.engine.execution.stream_watcher import WatchedTask
from airflow_streambatch.engine.protocol.backend import Backend, JobOutcome
from airflow_streambatch.engine.protocol.streams import StreamId
from airflow_streambatch.engine.protocol.tasks import OperatorPayload, Placement, TaskResult, TaskSpec


@dataclass
class SparkPartition:
    """One partition of a launched job: the operator whose tasks it runs now, those tasks
    (handed to it, results not back), its slot, and what it has done."""

    op: Operator
    gpu_ids: tuple[str, ...] | None  # its slot's GPUs; None while it holds no slot (between check-ins)
    assigned: list[TaskSpec] = field(default_factory=list)
    after: StreamId | None = None  # the stream of its last task: the next runs after it
    work_s: float = 0.0
    deadline: float = float("inf")  # task_timeout_s per task it runs now
    attempt: int = 0  # Spark's attempt that checks in: a later one means Spark lost and reran it
    handed_at: float = 0.0  # when its tasks were handed out by a check-in (0: with the job, which paid Spark's start)


@dataclass
class Launch:
    """One Spark job in flight: the operator that launched it and its partitions. They
    check in for more tasks (`check_ins.py`), of any operator that asks for the same
    resources, so a job runs as long as it has work."""

    op: Operator
    parts: list[SparkPartition]
    started: float = field(default_factory=time.monotonic)
    timed_out: bool = False
    tasks: int = 0  # tasks handed to it in all

    @property
    def specs(self) -> list[TaskSpec]:
        """The tasks handed to it whose results have not come back, partition by partition."""
        return [spec for part in self.parts for spec in part.assigned]

    def running(self, op_index: int) -> list[TaskSpec]:
        return [spec for part in self.parts if part.op.index == op_index for spec in part.assigned]

    @property
    def deadline(self) -> float:
        """When the partition most behind its tasks' ``task_timeout_s`` runs out of time."""
        return min((part.deadline for part in self.parts if part.assigned), default=float("inf"))


def _built_ahead(op: Operator, cpu_slots: float) -> list:
    """The stateful classes whose instances ``op``'s Spark partitions start building as they
    start, so a model loads while the input is read (`worker/build_ahead.py`): ``op``'s own
    classes without a cap (each of its workers builds one anyway), and the capped classes of
    ``op`` and later operators whose cap lets every task slot hold an instance (``concurrency``
    at least the CPU slots).

    A smaller cap is left out: Spark, not the engine, picks the Python worker of the
    operator's tasks, and one without an instance would have another released and build
    its own (seen: 4 copies built for a cap of 2 on 4 slots, against 2 without). So is a GPU
    operator's class: which GPUs an instance is built on is known once its own task is placed."""
    return [t for other in (op, *op.downstream) if set(other.compute.as_dict()) <= {"CPU"}
            for t in other.physical.transforms if inspect.isclass(getattr(t, "fn", None))  # not a sink
            and (t.compute.concurrency >= cpu_slots if t.compute.concurrency is not None else other is op)]


class Launcher:
    def __init__(self, ctx: DataContext, operators: list[Operator], backend: Backend, pool: ResourcePool,
                 memory: MemoryBudget, policy: SchedulingPolicy, grants: MemoryGrants, run_dir: str, run_id: str,
                 launch_log: list, blocks: BlockAccess, host_agents: bool, label: Callable[[int], str]):
        self.ctx = ctx
        self.backend = backend
        self.pool = pool
        self.memory = memory
        self.policy = policy
        self.grants = grants
        self.launch_log = launch_log  # (operator index, tasks, partitions) per launch, for stats
        self.blocks = blocks
        self.launches: dict[int, Launch] = {}
        self.run_id = run_id
        self.payloads = {
            op.index: pickled_operator(OperatorPayload(
                op.index, op.name, op.physical.transforms, run_dir, op.max_block_bytes, run_id, blocks.control,
                host_agents, memory_limit=ctx.memory_limit,
                build_ahead=_built_ahead(op, pool.totals.get("CPU", 0)) if ctx.build_ahead else []), op.name)
            for op in operators if op.runs_tasks
        }
        self.label = label  # an input partition's label, for tasks that name it in rows they set aside
        self.quarantining = {op.index for op in operators if any(t.dead_letter for t in op.physical.transforms)}

    def launch(self, op: Operator) -> None:
        """Launch a group as one Spark job: one partition per free slot, each running up
        to ``sizer.depth`` tasks in turn (never deeper than the ready tasks need)."""
        spark_partitions = op.usable_slots()
        taken = self._take(op, spark_partitions * self._depth(op))
        spark_partitions = min(spark_partitions, len(taken))
        launch_id = len(self.launch_log)
        launch = Launch(op, [SparkPartition(op, self.pool.acquire(op.index, op.compute))
                             for _ in range(spark_partitions)])
        groups: list[list[bytes]] = [[] for _ in range(spark_partitions)]
        for i, (spec, reserved) in enumerate(taken):
            groups[i % spark_partitions].append(self._hand_out(launch_id, launch, i % spark_partitions, spec, reserved))
        self.launch_log.append((op.index, len(taken), spark_partitions))
        self.launches[launch_id] = launch
        self.backend.submit(launch_id, op.name, self.payloads[op.index], groups, resources=op.compute.as_dict())

    def payload(self, op: Operator) -> bytes:
        """The pickled `OperatorPayload` every task of ``op`` runs with (lineage keeps it for replays)."""
        return self.payloads[op.index]

    def running_orders(self, op_index: int) -> list[tuple[int, ...]]:
        """The input-order places of operator ``op_index``'s running tasks (`flow.py`'s order gates wait for them)."""
        return [spec.order for launch in self.launches.values() for spec in launch.running(op_index)]

    def silent_tasks(self, op_index: int) -> int:
        """Tasks of operator ``op_index`` handed out whose output has not begun to arrive: each
        is a block on its way downstream (`flow.BlockFlow.blocks_to_come`)."""
        return sum(1 for launch in self.launches.values() for spec in launch.running(op_index)
                   if not self.grants.streamed(op_index, spec.task_key))

    def can_run(self, launch_id: int, op: Operator) -> bool:
        """Whether a partition of the launch may run tasks of ``op``: Spark placed it by its
        launching operator's resources, so only an operator that asks for the same may use it.
        A concurrency cap is the scheduler's, not Spark's: a model's partition (``concurrency=2``)
        may run a writer's tasks between its own."""
        return op.compute.resources == self.launches[launch_id].op.compute.resources

    def extend(self, launch_id: int, part: int, op: Operator) -> tuple[bytes | None, list[bytes]]:
        """More tasks, of ``op``, for a Spark partition that checked in and that the scheduler
        gives ``op``'s next slot: ``op``'s payload when the partition ran another operator
        until now, and its next group, pickled."""
        launch = self.launches[launch_id]
        spark_partition = launch.parts[part]
        switched = spark_partition.op is not op
        spark_partition.op = op
        spark_partition.gpu_ids = self.pool.acquire(op.index, op.compute)
        spark_partition.handed_at = time.monotonic()
        taken = self._take(op, self._depth(op))
        specs = [self._hand_out(launch_id, launch, part, spec, reserved) for spec, reserved in taken]
        return (self.payloads[op.index] if switched else None), specs

    def _depth(self, op: Operator) -> int:
        return op.sizer.depth(op.estimates.task_s, op.ready_tasks(), self.pool.capacity_for(op.compute))

    def _take(self, op: Operator, want: int) -> list[tuple[TaskSpec, float]]:
        """Up to ``want`` next tasks of ``op`` the policy lets start, each with its memory reservation."""
        taken: list[tuple[TaskSpec, float]] = []
        while len(taken) < want and op.has_input():
            alone = bool(op.retry_specs) and op.retry_specs[0].alone
            if taken and (alone or not self.policy.may_launch(op)):
                break
            reserved = self.policy.reservation(op)
            taken.append((op.next_task(), reserved))
            self.memory.reserved += reserved
            self.policy.on_launch(op, reserved)
            if alone or (op.probing and self.policy.probe_alone):
                break  # a probe runs alone until its size is known; so does a suspect of a failed job
        return taken

    def _hand_out(self, launch_id: int, launch: Launch, part: int, spec: TaskSpec, reserved: float) -> bytes:
        """Ready ``spec`` to run in Spark partition ``part`` of the launch, after the tasks
        already there: its inputs where they live now, and its `Placement` (its slot's GPUs,
        its watched stream and grant). The spec itself is never changed: a placed copy runs."""
        spark_partition = launch.parts[part]
        op = spark_partition.op
        inputs = tuple(self.blocks.current(ref) for ref in spec.inputs)  # rebuilt ones may live elsewhere now
        input_bytes = sum(ref.size_bytes for ref in inputs)
        if self.policy.strict:  # the reservation in bytes, not in blocks of a guessed size
            granted, allowance = 0, int(reserved)
        else:
            granted, allowance = int((reserved + input_bytes) // op.block_estimate(input_bytes)), 0
        stream = StreamId(op.index, spec.task_key, launch_id, self.run_id)
        spec = spec.placed(Placement(
            gpu_ids=spark_partition.gpu_ids, stream=stream, granted=granted, allowance=allowance,
            skip_blocks=self.grants.streamed(op.index, spec.task_key),
            pull=(launch_id, part) if self.ctx.group_scheduling else None,
            label=self.label(spec.partitions[0]) if op.index in self.quarantining else spec.placement.label,
        ), inputs)
        self.grants.watch(WatchedTask(stream, granted, reserved, input_bytes, after=spark_partition.after))
        spark_partition.after = stream
        spark_partition.assigned.append(spec)
        if self.ctx.task_timeout_s:
            spark_partition.deadline = time.monotonic() + self.ctx.task_timeout_s * len(spark_partition.assigned)
        launch.tasks += 1
        op.tasks_started()
        return cloudpickle.dumps(spec)

    def _unassign(self, spark_partition: SparkPartition) -> tuple[Operator, list[TaskSpec]]:
        """A partition's tasks ran (or will not): their streams, reservations and its slot go back."""
        op, specs = spark_partition.op, spark_partition.assigned
        spark_partition.assigned = []
        for spec in specs:
            self.grants.forget(str(spec.placement.stream))
        op.tasks_returned(len(specs))
        if spark_partition.gpu_ids is not None:
            self.pool.release(op.index, op.compute, spark_partition.gpu_ids)
            spark_partition.gpu_ids = None
        return op, specs

    def check_in(self, check_in: CheckIn) -> tuple[Operator, list[TaskSpec], list[TaskResult] | None] | None:
        """A Spark partition ran its tasks: their results in spec order; its slot is free
        again until `extend` hands it more. Results are None when Spark lost the attempt
        that ran them and this is its rerun; the call is None when it comes from an
        attempt Spark gave up on, or from a job that already ended (it failed while this
        partition ran: `finish` took its tasks back, and they run again)."""
        launch = self.launches.get(check_in.launch_id)
        if launch is None:
            return None
        spark_partition = launch.parts[check_in.part]
        if check_in.attempt < spark_partition.attempt:
            return None
        lost = check_in.attempt > spark_partition.attempt
        spark_partition.attempt = check_in.attempt
        op, specs = self._unassign(spark_partition)
        if lost:
            return op, specs, None
        results = [cloudpickle.loads(blob) for blob in check_in.results]
        if len(results) != len(specs):
            raise StreamBatchError(f"Spark partition {check_in.part} of launch {check_in.launch_id} sent "
                                   f"{len(results)} results for {len(specs)} tasks")
        work_s = sum(result.work_s for result in results)
        spark_partition.work_s += work_s
        if spark_partition.handed_at:  # what one more group cost beyond its work: a check-in, not a job
            op.sizer.observe_check_in(time.monotonic() - spark_partition.handed_at - work_s)
        else:  # its first group, handed out with the job: what the job took to start running it
            op.stats.started(max(0.0, time.monotonic() - self.launches[check_in.launch_id].started - work_s))
        return op, specs, results

    def take_back(self, launch_id: int, part: int) -> tuple[Operator, list[TaskSpec]]:
        """Tasks `extend` handed to a partition that stopped waiting for them: they never ran."""
        return self._unassign(self.launches[launch_id].parts[part])

    def next_outcome(self, timeout: float) -> JobOutcome | None:
        """The next finished job, waiting at most ``timeout`` (``0``: only one already there)."""
        try:
            return self.backend.outcomes.get(timeout=timeout) if timeout else self.backend.outcomes.get_nowait()
        except queue.Empty:
            return None

    def finish(self, outcome: JobOutcome) -> tuple[Launch, list[tuple[Operator, list[TaskSpec]]],
                                                   list[TaskResult] | None]:
        """A Spark job ended: its slots and reservations go back. Returns the tasks whose
        results did not come with a check-in, per partition, and their results: from the
        job, when its partitions did not check in (``group_scheduling`` off); ``None``
        when the job failed; else the tasks were handed to a partition that had stopped
        waiting for them, and run again."""
        launch = self.launches.pop(outcome.launch_id)
        left = [self._unassign(part) for part in launch.parts]
        results = [cloudpickle.loads(blob) for blob in outcome.results or []]  # partition by partition
        done = 0
        for part, (_, specs) in zip(launch.parts, left):
            part.work_s += sum(result.work_s for result in results[done:done + len(specs)])
            done += len(specs)
        self.launch_log[outcome.launch_id] = (launch.op.index, launch.tasks, len(launch.parts))
        if outcome.error is not None:
            return launch, left, None
        launch.op.sizer.observe(outcome.wall_s, [part.work_s for part in launch.parts], launch.tasks)
        return launch, left, results or [TaskResult.not_run(spec.task_key)
                                         for _, specs in left for spec in specs]

    def run_now(self, op_blob: bytes, spec: TaskSpec) -> TaskResult:
        """Run one task synchronously as its own Spark job (lineage replays)."""
        return cloudpickle.loads(self.backend.run_now(op_blob, cloudpickle.dumps(spec)))
