"""Logical plan and the planner that turns it into physical operators.

A logical plan is a chain: one source, then transforms, limits and repartitions.
The planner fuses each transform into the operator before it when both ask for the
same resources and concurrency (paper section 4.1): fusing a CPU step into a GPU
step would make the CPU work hold a GPU, which is what this engine exists to avoid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_streambatch.engine.blocks import BlockRef
from airflow_streambatch.engine.datasource import Datasource
from airflow_streambatch.engine.transforms import Compute, Transform, unique_names

SOURCE_COMPUTE = Compute.make("read", num_cpus=1)


@dataclass(frozen=True)
class Read:
    datasource: Datasource
    override_num_blocks: int | None = None


@dataclass(frozen=True)
class InputBlocks:
    """Blocks that already exist (a materialized dataset), with the lineage to rebuild them."""

    blocks: tuple[BlockRef, ...]
    lineage: dict = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Limit:
    n: int


@dataclass(frozen=True)
class Repartition:
    num_blocks: int


LogicalOp = Read | InputBlocks | Transform | Limit | Repartition


@dataclass
class PhysicalOp:
    """One schedulable operator: the unit that gets slots, a queue and statistics.

    ``kind`` is ``read`` (launches read tasks), ``blocks`` (emits existing blocks),
    ``map`` (transforms input blocks), ``limit`` (cuts block references in the
    driver, no tasks) or ``repartition`` (a barrier, then tasks that re-cut blocks).
    """

    kind: str
    name: str
    compute: Compute = SOURCE_COMPUTE
    transforms: list[Transform] = field(default_factory=list)
    read: Read | None = None
    blocks: tuple[BlockRef, ...] = ()
    limit: int | None = None
    num_blocks: int | None = None
    lineage: dict = field(default_factory=dict)

    @property
    def runs_tasks(self) -> bool:
        return self.kind in ("read", "map", "repartition")


def _source_name(op: Read | InputBlocks) -> str:
    return f"Read{op.datasource.name}" if isinstance(op, Read) else "InputBlocks"


def plan(logical: list[LogicalOp], fuse: bool = True) -> list[PhysicalOp]:
    """Physical operators for a logical chain, fusing equal-resource neighbours."""
    source, *rest = logical
    ops = [
        PhysicalOp("read", _source_name(source), read=source)
        if isinstance(source, Read)
        else PhysicalOp("blocks", _source_name(source), blocks=source.blocks, lineage=source.lineage)
    ]
    for op in rest:
        last = ops[-1]
        if isinstance(op, Transform):
            if fuse and last.kind in ("read", "map") and last.compute == op.compute:
                last.transforms.append(op)
                last.name = f"{last.name}->{op.name}"
            else:
                ops.append(PhysicalOp("map", op.name, compute=op.compute, transforms=[op]))
        elif isinstance(op, Limit):
            if last.kind == "limit":
                last.limit = min(last.limit, op.n)
            else:
                ops.append(PhysicalOp("limit", f"Limit[{op.n}]", limit=op.n))
        elif isinstance(op, Repartition):
            ops.append(PhysicalOp("repartition", f"Repartition[{op.num_blocks}]", num_blocks=op.num_blocks))
        else:  # pragma: no cover - the Dataset API builds only the kinds above
            raise TypeError(f"unknown logical operator {op!r}")
    for op, name in zip(ops, unique_names([o.name for o in ops])):
        op.name = name
    return ops
