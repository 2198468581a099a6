"""Launches: packing an operator's next tasks into one Spark job, and unpacking its outcome.

A launch takes one Spark partition per usable slot, each running up to
``sizer.depth`` tasks in turn (group scheduling, `spark/group_sizer.py`). Each task
gets a memory reservation the policy sizes, its slot's GPU ids, and an output
stream the driver watches (`memory.MemoryGrants`).
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass

from pyspark import cloudpickle

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.execution.block_access import BlockAccess
from airflow_streambatch.engine.execution.memory import MemoryBudget, MemoryGrants
from airflow_streambatch.engine.execution.operators import Operator
from airflow_streambatch.engine.execution.policies import SchedulingPolicy
from airflow_streambatch.engine.execution.resources import ResourcePool
from airflow_streambatch.engine.execution.stream_watcher import WatchedTask
from airflow_streambatch.engine.spark.backend import JobOutcome, SparkBackend
from airflow_streambatch.engine.worker.streams import stream_name
from airflow_streambatch.engine.worker.task_runner import OperatorPayload, TaskResult, TaskSpec


@dataclass
class Launch:
    """One Spark job in flight: its operator, tasks and slots, and its deadline."""

    op: Operator
    specs: list[TaskSpec]
    gpu_ids: list[tuple[str, ...]]
    deadline: float = float("inf")  # task_timeout_s times the tasks one Spark partition runs in turn
    timed_out: bool = False


class Launcher:
    def __init__(self, ctx: DataContext, operators: list[Operator], backend: SparkBackend, pool: ResourcePool,
                 memory: MemoryBudget, policy: SchedulingPolicy, grants: MemoryGrants, run_dir: str, run_id: str,
                 launch_log: list, blocks: BlockAccess, host_agents: bool):
        self.ctx = ctx
        self.backend = backend
        self.pool = pool
        self.memory = memory
        self.policy = policy
        self.grants = grants
        self.launch_log = launch_log  # (operator index, tasks, partitions) per launch, for stats
        self.blocks = blocks
        self.launches: dict[int, Launch] = {}
        self.payloads = {
            op.index: cloudpickle.dumps(OperatorPayload(
                op.index, op.name, op.physical.transforms, run_dir, op.max_block_bytes, run_id, blocks.control,
                host_agents))
            for op in operators if op.runs_tasks
        }

    def launch(self, op: Operator) -> None:
        """Launch a group as one Spark job: one partition per free slot, each running up
        to ``sizer.depth`` tasks in turn (never deeper than the ready tasks need)."""
        spark_partitions = op.usable_slots()
        depth = op.sizer.depth(op.estimates.task_s, op.ready_tasks(), self.pool.capacity_for(op.compute))
        want = spark_partitions * depth
        specs: list[TaskSpec] = []
        reservations: list[float] = []
        while len(specs) < want and op.has_input():
            alone = bool(op.retry_specs) and op.retry_specs[0].alone
            if specs and (alone or not self.policy.may_launch(op)):
                break
            reserved = self.policy.reservation(op)
            specs.append(op.next_task())
            reservations.append(reserved)
            self.memory.reserved += reserved
            self.policy.on_launch(op, reserved)
            if alone or op.probing:
                break  # a probe runs alone until its size is known; so does a suspect of a failed job
        spark_partitions = min(spark_partitions, len(specs))
        gpu_ids = [self.pool.acquire(op.index, op.compute) for _ in range(spark_partitions)]
        launch_id = len(self.launch_log)
        groups: list[list[bytes]] = [[] for _ in range(spark_partitions)]
        previous: list[str | None] = [None] * spark_partitions  # tasks of a partition run one after another
        for i, (spec, reserved) in enumerate(zip(specs, reservations)):
            spec.inputs = [self.blocks.current(ref) for ref in spec.inputs]  # rebuilt ones may live elsewhere now
            spec.gpu_ids = gpu_ids[i % spark_partitions]
            spec.stream = stream_name(op.index, spec.task_key, launch_id)
            input_bytes = sum(ref.size_bytes for ref in spec.inputs)
            spec.granted = int((reserved + input_bytes) // op.block_estimate(input_bytes))
            spec.skip_blocks = self.grants.streamed(op.index, spec.task_key)
            self.grants.watch(WatchedTask(op.index, spec.task_key, spec.stream, spec.granted, reserved,
                                          input_bytes, after=previous[i % spark_partitions]))
            previous[i % spark_partitions] = spec.stream
            groups[i % spark_partitions].append(cloudpickle.dumps(spec))
        op.running_tasks += len(specs)
        op.stats.launched(len(specs))
        self.launch_log.append((op.index, len(specs), spark_partitions))
        timeout = self.ctx.task_timeout_s
        depth = -(-len(specs) // spark_partitions)  # tasks the busiest Spark partition runs in turn
        deadline = time.monotonic() + timeout * depth if timeout else float("inf")
        self.launches[launch_id] = Launch(op, specs, gpu_ids, deadline)
        self.backend.submit(launch_id, op.name, self.payloads[op.index], groups, resources=op.compute.as_dict())

    def next_outcome(self, timeout: float) -> JobOutcome | None:
        """The next finished job, waiting at most ``timeout`` (``0``: only one already there)."""
        try:
            return self.backend.outcomes.get(timeout=timeout) if timeout else self.backend.outcomes.get_nowait()
        except queue.Empty:
            return None

    def finish(self, outcome: JobOutcome) -> tuple[Launch, list[TaskResult] | None]:
        """Give back a finished job's slots and reservations; its task results in spec
        order, or ``None`` when the job itself failed."""
        launch = self.launches.pop(outcome.launch_id)
        op, specs = launch.op, launch.specs
        for spec in specs:
            self.grants.forget(spec.stream)
        for ids in launch.gpu_ids:
            self.pool.release(op.index, op.compute, ids)
        op.running_tasks -= len(specs)
        if outcome.error is not None:
            return launch, None
        # results come back Spark partition by Spark partition; spec i ran in Spark partition i % spark_partitions
        spark_partitions = len(launch.gpu_ids)
        order = [i for p in range(spark_partitions) for i in range(p, len(specs), spark_partitions)]
        results: list[TaskResult] = [None] * len(specs)
        for i, blob in zip(order, outcome.results):
            results[i] = cloudpickle.loads(blob)
        per_partition_work = [0.0] * spark_partitions
        for i, result in enumerate(results):
            per_partition_work[i % spark_partitions] += result.work_s
        op.sizer.observe(outcome.wall_s, per_partition_work, len(specs))
        return launch, results

    def run_now(self, op_blob: bytes, spec: TaskSpec) -> TaskResult:
        """Run one task synchronously as its own Spark job (lineage replays)."""
        return cloudpickle.loads(self.backend.run_now(op_blob, cloudpickle.dumps(spec)))
