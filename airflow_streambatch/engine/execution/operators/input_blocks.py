"""Input blocks: the source of a materialized dataset, whose blocks already exist.

It runs no tasks: at start it passes its blocks downstream. They belong to the
materialized dataset, so this run never deletes them.

Their input partitions are this run's. A block of the run that materialized them may
descend from several (a model's task that took small blocks of three read tasks,
allowed where nothing is committed): such a block is one partition of this run, so a
write commits each block's rows exactly once (a sink task writes one partition).
"""

from __future__ import annotations

from dataclasses import replace

from airflow_streambatch.engine.execution.operators.base import Operator


class InputBlocksOperator(Operator):
    def start(self, flow, partitions, committer, skipped: dict) -> None:
        for ref in own_partitions(self.physical.blocks):
            flow.emit(self, ref, owned=False)
        self.upstream_done = True


def own_partitions(blocks: list) -> list:
    """The blocks as they are when each descends from one input partition; else each distinct set
    of partitions renumbered as one partition of this run, in the blocks' order."""
    if all(len(ref.partitions) == 1 for ref in blocks):
        return list(blocks)
    numbers: dict[tuple[int, ...], int] = {}
    return [replace(ref, partitions=(numbers.setdefault(ref.partitions, len(numbers)),)) for ref in blocks]
