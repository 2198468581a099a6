"""Lineage: how to rebuild any block of a run by re-running the task that produced it.

Each finished task registers its blocks with the operator payload and task spec
that made them, and how many blocks it emitted. A lost block (its file is gone:
the executor's disk died, a tmpfs was wiped) is rebuilt by replaying that task; if
the task's own inputs are gone too, they are rebuilt first, recursively, down to
the read tasks (paper section 4.2.2). Streaming repartition is deterministic, so a
replay must emit the same number of blocks at the same paths; if it does not, the
operator is not deterministic and the error says which task.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from airflow_streambatch.engine.errors import LineageError, UserCodeError
from airflow_streambatch.engine.execution.block_access import BlockAccess
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.tasks import TaskResult, TaskSpec

log = logging.getLogger("airflow_streambatch.engine.progress")

MAX_REPLAYS = 3


@dataclass(frozen=True)
class LineageRecord:
    operator: str
    op_blob: bytes
    spec: TaskSpec
    block_count: int


def base_id(ref: BlockRef) -> str:
    """The id of the block file a reference (or a slice of it) points into."""
    return ref.block_id.split("[", 1)[0]


class LineageTable:
    def __init__(self, records: dict[str, LineageRecord] | None = None):
        self.records: dict[str, LineageRecord] = dict(records or {})

    def register(self, operator: str, op_blob: bytes, spec: TaskSpec, blocks: list[BlockRef]) -> None:
        record = LineageRecord(operator, op_blob, spec, len(blocks))
        for ref in blocks:
            self.records[ref.block_id] = record

    def rebuild(self, ref: BlockRef, run_task: Callable[[bytes, TaskSpec], TaskResult],
                still_needed: Callable[[str], bool], blocks: BlockAccess) -> None:
        """Recreate the file of ``ref`` by replaying its producing task (and, first, any lost inputs),
        on whichever host Spark runs it: ``blocks`` learns where the replay wrote them."""
        record = self.records.get(base_id(ref))
        if record is None:
            raise LineageError(f"block {ref.block_id} ({ref.path}) is lost and no task of this run produced it")
        spec = record.spec
        log.warning("rebuilding lost block %s by replaying task %s of %s", ref.block_id, spec.task_key,
                    record.operator)
        for _ in range(MAX_REPLAYS):
            spec = replace(spec, inputs=tuple(blocks.current(parent) for parent in spec.inputs))
            result = run_task(record.op_blob, spec)
            if not result.lost_inputs:
                break
            lost = set(result.lost_inputs)
            for parent in spec.inputs:
                if parent.block_id in lost:
                    self.rebuild(parent, run_task, still_needed, blocks)
        else:
            raise LineageError(f"task {spec.task_key} of {record.operator} kept losing its inputs while replaying")
        if result.error is not None:
            raise UserCodeError(record.operator, spec.partitions, f"replay failed: {result.error}",
                                result.error_traceback)
        if len(result.blocks) != record.block_count:
            raise LineageError(
                f"replay of task {spec.task_key} of {record.operator} (input partitions {spec.partitions}) "
                f"produced {len(result.blocks)} blocks; its first run produced {record.block_count}. "
                "The operator is not deterministic, so its lost output cannot be rebuilt."
            )
        blocks.relocated(result.blocks)
        for block in result.blocks:  # the replay rewrote all of the task's blocks: keep the live ones
            if block.path != ref.path and not still_needed(block.path):
                blocks.delete(block)
