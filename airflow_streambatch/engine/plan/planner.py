"""The planner: turns a logical chain into physical operators, fusing where it may.

The planner fuses each transform into the operator before it when both ask for the
same resources and concurrency (paper section 4.1): fusing a CPU step into a GPU
step would make the CPU work hold a GPU, which is what this engine exists to avoid.
Each physical operator kind is a class; the executor gives each one its runtime
state (`execution/operators/`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from airflow_streambatch.engine.plan.logical import (
    InputBlocks,
    Limit,
    LogicalOp,
    Read,
    Repartition,
    ResourceRequest,
    Transform,
    unique_names,
)
from airflow_streambatch.engine.plan.sort import SortBy, with_map_sides
from airflow_streambatch.engine.protocol.blocks import BlockRef

SOURCE_REQUEST = ResourceRequest.make("read", num_cpus=1)


@dataclass
class PhysicalOp:
    """One schedulable operator: the unit that gets slots, a queue and statistics."""

    name: str
    compute: ResourceRequest = SOURCE_REQUEST
    transforms: list[Transform] = field(default_factory=list)

    runs_tasks: ClassVar[bool] = True  # False: works on block references in the driver
    fuses_transforms: ClassVar[bool] = False  # later transforms of the same request join its tasks


@dataclass
class ReadOp(PhysicalOp):
    """Launches read tasks, one per input partition."""

    read: Read | None = None
    fuses_transforms: ClassVar[bool] = True


@dataclass
class InputBlocksOp(PhysicalOp):
    """Emits blocks that already exist (a materialized dataset); runs no tasks."""

    blocks: tuple[BlockRef, ...] = ()
    lineage: dict = field(default_factory=dict)
    runs_tasks: ClassVar[bool] = False


@dataclass
class MapOp(PhysicalOp):
    """Runs its fused transforms over bundles of input blocks."""

    fuses_transforms: ClassVar[bool] = True


@dataclass
class LimitOp(PhysicalOp):
    """Passes on the first ``limit`` rows, slicing block references in the driver."""

    limit: int = 0
    runs_tasks: ClassVar[bool] = False


@dataclass
class RepartitionOp(PhysicalOp):
    """A barrier, then one task per output block that re-cuts the input's rows."""

    num_blocks: int | None = 1
    rows_per_block: int | None = None  # instead of num_blocks: blocks of this many rows (the last fewer)
    shuffle: bool = False  # each output block takes a slice of every input block
    by_group: bool = False  # output block j joins the input blocks placed (j, ...) (``zip``)


@dataclass
class SortOp(RepartitionOp):
    """A barrier that range-partitions key-sorted blocks by key, then one reduce task per range."""

    keys: tuple[str, ...] = ()
    descending: tuple[bool, ...] = ()
    boundaries: tuple | None = None  # given cut values of the first key (None: sampled)


def _source(op: Read | InputBlocks) -> PhysicalOp:
    if isinstance(op, Read):
        return ReadOp(f"Read{op.datasource.name}", compute=op.compute or SOURCE_REQUEST, read=op)
    return InputBlocksOp("InputBlocks", blocks=op.blocks, lineage=op.lineage)


def plan(logical: list[LogicalOp], fuse: bool = True) -> list[PhysicalOp]:
    """Physical operators for a logical chain, fusing equal-resource neighbours."""
    source, *rest = with_map_sides(logical)
    ops = [_source(source)]
    for op in rest:
        last = ops[-1]
        if isinstance(op, Transform):
            if fuse and last.fuses_transforms and last.compute == op.compute:
                last.transforms.append(op)
                last.name = f"{last.name}->{op.name}"
            else:
                ops.append(MapOp(op.name, compute=op.compute, transforms=[op]))
        elif isinstance(op, Limit):
            if isinstance(last, LimitOp):
                last.limit = min(last.limit, op.n)
            else:
                ops.append(LimitOp(f"Limit[{op.n}]", limit=op.n))
        elif isinstance(op, Repartition):
            label = op.num_blocks if op.rows_per_block is None else f"num_rows_per_block={op.rows_per_block}"
            name = op.reduce.name if op.reduce is not None else f"Repartition[{label}]"
            ops.append(RepartitionOp(name, num_blocks=op.num_blocks, rows_per_block=op.rows_per_block,
                                     shuffle=op.shuffle, by_group=op.by_group,
                                     transforms=[op.reduce] if op.reduce is not None else []))
        elif isinstance(op, SortBy):
            reduce = op.reduce_side()
            ops.append(SortOp(reduce.name, compute=reduce.compute, num_blocks=None, transforms=[reduce], keys=op.keys,
                              descending=op.descending, boundaries=op.boundaries))
        else:  # pragma: no cover - the Dataset API builds only the kinds above
            raise TypeError(f"unknown logical operator {op!r}")
    for op, name in zip(ops, unique_names([o.name for o in ops])):
        op.name = name
    return ops
