"""Tasks as the driver hands them out and as they come back: `TaskSpec`, `Placement`,
`OperatorPayload`, `TaskResult`.

Why here: the driver's operators create specs (`execution/operators`), its launcher places and
pickles them (`execution/launcher.py`), lineage replays them; the partition function on the
executors (`worker/task_runner.py`) unpickles and runs them and returns results. Neither side's
code is needed to read these.

A `TaskSpec` says what the task is (its key, inputs, read task, place in input order) and is
frozen: the same spec is retried, replayed by lineage and compared, so nothing may edit it in
place. What one launch decides for one attempt (its slot's GPUs, watched stream, grant, the
blocks an earlier attempt delivered, the partition that pulls for more) is its `Placement`,
set with `TaskSpec.placed` at hand-out; a retry gets a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.protocol.staging import StagedFile
from airflow_streambatch.engine.protocol.streams import NO_GRANT_LIMIT, StreamId

if TYPE_CHECKING:  # plan nodes arrive pickled; the worker only calls their methods
    from airflow_streambatch.engine.plan.datasource import ReadTask
    from airflow_streambatch.engine.plan.logical import Transform


@dataclass
class OperatorPayload:
    """The part of a task that is the same for every task of one operator.

    ``host_agents``: blocks stay on the host that wrote them and its agent serves them
    (`worker/host_agent.py`); off in local mode, where every task shares the driver's host.
    """

    op_index: int
    name: str
    transforms: list[Transform]
    run_dir: str
    target_block_bytes: int
    run_id: str = ""
    control: ControlInfo | None = None
    host_agents: bool = False
    location: str = ""  # set on the executor: this host's agent
    memory_limit: int = 0  # DataContext.memory_limit: a host's block directory must hold it (`block_room.py`)
    # stateful classes (of this CPU operator, or capped ones of later ones) whose instances this
    # operator's Spark partitions start building, so a model loads while the input is read
    # (`DataContext.build_ahead`, `worker/build_ahead.py`)
    build_ahead: list[Transform] = field(default_factory=list)


@dataclass(frozen=True)
class Placement:
    """What a launch assigned to one attempt of a task (`execution/launcher.py`).

    ``stream`` names the task's output stream (`worker/streams.py`) when the driver watches
    it: the task may then write ``granted`` blocks, or blocks of ``allowance`` bytes in
    all, before it must wait for a grant, and skips the first ``skip_blocks``, which an
    earlier attempt delivered. The default is an unplaced task: unwatched, writing freely.
    """

    gpu_ids: tuple[str, ...] = ()
    stream: StreamId | None = None
    granted: int = NO_GRANT_LIMIT
    allowance: int = 0  # bytes it may write without asking (the strict policy's reservation)
    skip_blocks: int = 0
    pull: tuple[int, int] | None = None  # (launch, Spark partition) it runs in, which checks in for more
    label: str | None = None  # its input partition's label, where it may set rows aside (`row_errors.py`)


@dataclass(frozen=True)
class TaskSpec:
    """One task: its stable key, what it reads, and the partitions it descends from."""

    task_key: str
    partitions: tuple[int, ...]
    inputs: tuple[BlockRef, ...] = ()
    read_task: ReadTask | None = None
    alone: bool = False  # shared a Spark job that failed: runs in a job of its own, to find the task at fault
    order: tuple[int, ...] = ()  # the place of its output in input order (`BlockRef.order`)
    placement: Placement = Placement()

    def placed(self, placement: Placement, inputs: tuple[BlockRef, ...] | None = None) -> TaskSpec:
        """This task as one launch runs it: with ``placement``, and its ``inputs`` where they
        live now (blocks rebuilt by lineage may live on another host)."""
        return replace(self, placement=placement, inputs=self.inputs if inputs is None else tuple(inputs))

    def for_replay(self) -> TaskSpec:
        """This task as lineage replays it: synchronously, writing every block, unwatched."""
        return replace(self, placement=replace(self.placement, stream=None, granted=NO_GRANT_LIMIT,
                                               skip_blocks=0, pull=None))


@dataclass
class TaskResult:
    task_key: str
    blocks: list[BlockRef]
    work_s: float
    input_bytes: int
    output_bytes: int
    error: str | None = None
    error_traceback: str = ""
    lost_inputs: list[str] = field(default_factory=list)  # input block ids whose files are gone
    files: list[StagedFile] = field(default_factory=list)  # what a sink task staged
    no_space: str | None = None  # the path a write failed on for want of disk space (not the partition's fault)
    yielded: bool = False  # preempted while waiting for memory, or not started after one was: run it again
    fetched_bytes: int = 0  # input bytes read from another host
    exception: bytes | None = None  # the user's exception, pickled (`portable_exception`), for the driver to raise
    builds: int = 0  # stateful UDF instances (model copies) the task built
    build_s: float = 0.0  # seconds spent building them (part of ``work_s``, but for ``build_ahead_s``)
    build_ahead_s: float = 0.0  # of those, seconds built ahead of the task (`DataContext.build_ahead`), not waited for
    quarantined: list[StagedFile] = field(default_factory=list)  # the rows it set aside, staged (`row_errors.py`)

    @classmethod
    def not_run(cls, task_key: str) -> TaskResult:
        """A task that gave its slot back before it ran (or while it waited for memory): it runs again later."""
        return cls(task_key, [], 0.0, 0, 0, yielded=True)

    @classmethod
    def preempted(cls, task_key: str, work_s: float, input_bytes: int) -> TaskResult:
        """A task told to yield while it waited for memory: what it announced stays delivered, it runs
        again later (skipping those blocks), and its work so far still counts for the estimates."""
        return cls(task_key, [], work_s, input_bytes, 0, yielded=True)

    @classmethod
    def inputs_lost(cls, task_key: str, lost: list[str]) -> TaskResult:
        """A task whose input blocks are gone: the driver rebuilds them by lineage, then runs it again."""
        return cls(task_key, [], 0.0, 0, 0, lost_inputs=lost)
