"""What runs on Spark executors: a task reads its input, runs its fused transforms
and cuts the output into blocks; a group of tasks is one Spark partition.

Task code catches the user's exceptions and returns them as results instead of
raising: a Python worker that raises (or leaves its input iterator undrained) is
killed by Spark, and with it every stateful UDF's loaded model. The traceback
travels back to the driver, which decides what failed and where.

What a task is and what it returns (`TaskSpec`, `TaskResult`) and the check-in messages are
contracts the driver shares: they live in `engine/protocol`.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Iterator

from pyspark import cloudpickle

from airflow_streambatch.engine.errors import is_disk_full
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.check_ins import CHECK_IN_WAIT_S, CheckInCall, CheckInReply
from airflow_streambatch.engine.protocol.tasks import OperatorPayload, TaskResult, TaskSpec
from airflow_streambatch.engine.worker.blocks import BlockBuilder, write_block
from airflow_streambatch.engine.worker.control_client import call
from airflow_streambatch.engine.worker.host_agent import ensure_agent, prepare_run_dir
from airflow_streambatch.engine.worker.row_errors import write_set_aside
from airflow_streambatch.engine.worker.streams import OutputStream, TaskYielded
from airflow_streambatch.engine.worker.transport import BlockLostError, read_any
from airflow_streambatch.engine.worker.udf import TaskEnv, build_ahead_of_tasks, chain, gpu_env
from airflow_streambatch.engine.worker.unify import unify_tables

MAX_EXCEPTION_BYTES = 64 * 1024


def portable_exception(exc: BaseException) -> bytes | None:
    """``exc`` pickled for the trip to the driver, which raises it as the failure's cause (so
    ``except ValueError`` works there as in Ray Data); None when it cannot be pickled or is too
    large to carry (its text and traceback still travel)."""
    try:
        data = cloudpickle.dumps(exc)
    except Exception:  # noqa: BLE001 - any exception may hold anything (locks, sockets, ...)
        return None
    return data if len(data) <= MAX_EXCEPTION_BYTES else None


def _fetch_inputs(op: OperatorPayload, spec: TaskSpec) -> tuple[list, list[str], int]:
    """Every input block of ``spec`` (from this host or fetched from the one that holds it),
    before any output is written: a lost one is rebuilt by the driver and the task run again.
    Returns the tables, the ids of lost blocks and the bytes that crossed the network."""
    tables, lost, fetched = [], [], 0
    for ref in spec.inputs:
        try:
            table, moved = read_any(ref, op.control)
        except BlockLostError:
            lost.append(ref.block_id)
            continue
        tables.append(table)
        fetched += moved
    return tables, lost, fetched


class TaskOutput:
    """Writes one task's blocks. Skips those an earlier attempt delivered, waits for the
    driver's grant before writing past its placement's ``granted``, and announces each block on the
    task's stream as soon as it is written, then that the task is done."""

    def __init__(self, op: OperatorPayload, spec: TaskSpec):
        self.op = op
        self.spec = spec
        self.blocks: list[BlockRef] = []
        placed = spec.placement
        self.stream = (OutputStream(op.control, str(placed.stream), placed.granted, placed.allowance)
                       if placed.stream is not None else None)
        self.announced = 0
        self.writing: str | None = None  # the block file being written

    @property
    def waited_s(self) -> float:
        return self.stream.waited_s if self.stream is not None else 0.0

    def emit(self, table) -> BlockRef:
        op, spec, index = self.op, self.spec, len(self.blocks)
        ref = BlockRef(
            block_id=f"{op.op_index}:{spec.task_key}:{index}",
            path=os.path.join(op.run_dir, f"{op.op_index}-{spec.task_key}-{index}.arrow"),
            num_rows=table.num_rows,
            size_bytes=table.nbytes,
            producer=(op.name, spec.task_key, index),
            partitions=spec.partitions,
            location=op.location,
            order=(*spec.order, index),
        )
        self.blocks.append(ref)
        if index < spec.placement.skip_blocks:
            return ref  # an earlier attempt delivered it: regenerated, not written again
        if self.stream is not None:
            self.stream.wait_for(index, table.nbytes)
        self.writing = ref.path
        write_block(table, ref.path)
        self.writing = None
        if self.stream is not None:
            self.stream.announce(ref)
            self.announced += 1
        return ref

    def discard_unannounced(self) -> None:
        """The task failed: remove what it wrote that the driver does not know of."""
        for ref in self.blocks[self.spec.placement.skip_blocks + self.announced:]:
            _remove(ref.path)


def run_task(op: OperatorPayload, spec: TaskSpec) -> TaskResult:
    """Run one task to completion; never raises for errors in user code or data."""
    start = time.perf_counter()
    inputs, lost, fetched = _fetch_inputs(op, spec)
    if lost:  # the driver rebuilds them by lineage, then runs this task again
        return TaskResult.inputs_lost(spec.task_key, lost)
    gpu_ids, local = _task_gpus(spec)
    env = TaskEnv(gpu_ids=gpu_ids, task_key=spec.task_key, run_id=op.run_id, partitions=spec.partitions,
                  control=op.control, input_label=spec.placement.label)
    gpu_env(env.gpu_ids, local=local)
    output = TaskOutput(op, spec)
    builder = BlockBuilder(op.target_block_bytes, output.emit)
    input_bytes = sum(ref.size_bytes for ref in spec.inputs)
    schema = None
    try:
        if not op.transforms:  # a barrier that only re-cuts blocks (repartition): one schema, as Ray unifies
            inputs = unify_tables(inputs)
        source = spec.read_task.read() if spec.read_task is not None else iter(inputs)
        for table in chain(op.transforms, source, env):
            if schema is None:
                schema = table.schema
            elif table.num_rows and not table.schema.equals(schema):
                raise TypeError(f"{op.name} produced batches of different schemas in one task: {schema} then "
                                f"{table.schema}; return the same columns and types from every batch")
            for _ in builder.add(table):
                pass
        for _ in builder.finish():
            pass
        quarantined = write_set_aside(env)
        if output.stream is not None:
            output.stream.finish(len(output.blocks))
    except TaskYielded:  # the driver needs the slot: what was announced stays delivered
        output.discard_unannounced()
        return TaskResult.preempted(spec.task_key, time.perf_counter() - start - output.waited_s, input_bytes)
    except Exception as exc:  # noqa: BLE001 - user code: report, never crash the worker
        output.discard_unannounced()
        no_space = (output.writing or getattr(exc, "filename", None) or "") if is_disk_full(exc) else None
        return TaskResult(
            spec.task_key, [], time.perf_counter() - start, input_bytes, 0,
            error=f"{type(exc).__name__}: {exc}", error_traceback=traceback.format_exc(), no_space=no_space,
            exception=portable_exception(exc), builds=env.builds, build_s=env.build_s,
            build_ahead_s=env.build_ahead_s,
        )
    finally:
        env.end_task()  # its stateful UDF instances go idle, or are released (`udf.py`)
    return TaskResult(  # time spent waiting for grants is not work: estimates must not count it
        spec.task_key, output.blocks, time.perf_counter() - start - output.waited_s, input_bytes,
        sum(ref.size_bytes for ref in output.blocks), files=env.written, fetched_bytes=fetched,
        builds=env.builds, build_s=env.build_s, build_ahead_s=env.build_ahead_s, quarantined=quarantined,
    )


def _task_gpus(spec: TaskSpec) -> tuple[tuple[str, ...], bool]:
    """The GPUs this task may use, and whether the driver numbered them (local mode).

    On a cluster only Spark knows which GPUs of which host a task holds: it assigns them by
    the operator's resource profile, and the backend marks every cluster job with what its
    tasks asked for (the local property below, `spark/profiles.SPARK_RESOURCES_PROPERTY`; on
    Spark Connect the environment variable `spark/profiles.SPARK_RESOURCES_ENV`).
    There a task takes Spark's addresses or none: an id the driver made up would name a GPU
    of another host, or one that another task holds. In local mode (no mark) Spark cannot
    schedule by resources, and the driver's scheduler assigned the placement's ``gpu_ids``.
    """
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
    except ImportError:  # pragma: no cover - pyspark is a dependency
        ctx = None
    asked = None
    if ctx is not None:  # a Spark Connect job has no local properties: its function set the mark in the env
        asked = ctx.getLocalProperty("streambatch.sparkResources") or os.environ.get("STREAMBATCH_SPARK_RESOURCES")
    if asked is None:  # local mode, or outside Spark
        return spec.placement.gpu_ids, True
    if "gpu" not in asked.split(","):
        return (), False  # a CPU operator holds no GPU, even on an executor that has some
    gpus = ctx.resources().get("gpu")
    if gpus is None or not gpus.addresses:
        raise RuntimeError(
            "Spark assigned no GPU to a task of an operator with num_gpus: its executor owns none. Set "
            "spark.dynamicAllocation.enabled=true (executors with GPUs for GPU operators) or "
            "spark.executor.resource.gpu.amount, and spark.worker.resource.gpu.amount with "
            "spark.worker.resource.gpu.discoveryScript on the GPU workers (docs/cluster-gpus.md)")
    return tuple(gpus.addresses), False


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def run_partition(op_blob: bytes, groups: Iterator[list[bytes]]) -> Iterator[bytes]:
    """The Spark partition function: runs each task of its group in turn, then, for a launched
    group, checks in with the driver for more (`execution/check_ins.py`) until it gets none.

    Drains its whole input, so Spark keeps the Python worker (and its cached models).
    Returns the results of tasks run outside a launch (lineage replays); a launched
    group's results travel with its check-ins.
    """
    op: OperatorPayload = cloudpickle.loads(op_blob)
    if op.host_agents:  # this host's blocks outlive this worker: its agent serves them, then removes them
        agent = ensure_agent(os.path.dirname(op.run_dir), op.control, op.memory_limit, op.target_block_bytes)
        prepare_run_dir(op.run_dir, agent["mark"])
        op.location = agent["uri"]
    specs = [cloudpickle.loads(blob) for group in groups for blob in group]
    build_ahead_of_tasks(op)
    pull = specs[0].placement.pull if specs else None
    if pull is None:
        return iter([cloudpickle.dumps(r) for r in _run_group(op, specs)])
    attempt = _attempt()
    results = _run_group(op, specs) if attempt == 0 else []  # Spark reran a lost partition: the driver reruns its tasks
    seq = 0
    while True:
        check_in = CheckInCall(op.run_id, pull[0], pull[1], attempt, seq, [cloudpickle.dumps(r) for r in results])
        reply = CheckInReply.from_wire(call(op.control, "check_in", check_in.to_wire(), wait_s=CHECK_IN_WAIT_S))
        seq += 1
        if reply.payload is not None:  # the slot goes to another operator that asks for the same resources
            location, op = op.location, cloudpickle.loads(reply.payload)
            op.location = location
            build_ahead_of_tasks(op)
        specs = [cloudpickle.loads(blob) for blob in reply.specs]
        if not specs:
            return iter([])
        results = _run_group(op, specs)


def _attempt() -> int:
    """Spark's attempt number of this partition: above 0 when its executor was lost and Spark ran it again."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.attemptNumber() if ctx is not None else 0


def _run_group(op: OperatorPayload, specs: list[TaskSpec]) -> list[TaskResult]:
    results: list[TaskResult] = []
    for spec in specs:
        if results and results[-1].yielded:  # the slot goes back now: later tasks of the group run later
            results.append(TaskResult.not_run(spec.task_key))
        else:
            results.append(run_task(op, spec))
    return results
