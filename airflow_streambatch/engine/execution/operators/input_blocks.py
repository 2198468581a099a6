"""Input blocks: the source of a materialized dataset, whose blocks already exist.

It runs no tasks: at start it passes its blocks downstream. They belong to the
materialized dataset, so this run never deletes them.
"""

from __future__ import annotations

from airflow_streambatch.engine.execution.operators.base import Operator


class InputBlocksOperator(Operator):
    def start(self, flow, partitions, committer, skipped: dict) -> None:
        for ref in self.physical.blocks:
            flow.emit(self, ref, owned=False)
        self.upstream_done = True
