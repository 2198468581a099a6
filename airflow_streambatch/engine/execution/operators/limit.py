"""Limit: passes on the first ``limit`` rows by slicing block references in the
driver (no task, no copy), then cuts everything upstream."""

from __future__ import annotations

from airflow_streambatch.engine.execution.operators.base import Operator
from airflow_streambatch.engine.protocol.blocks import BlockRef


class LimitOperator(Operator):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows_seen = 0  # rows passed on so far

    def accept(self, ref: BlockRef, flow) -> None:
        limit = self.physical.limit
        remaining = limit - self.rows_seen
        if remaining <= 0:
            flow.release(ref)
            return
        if ref.num_rows > remaining:
            part = ref.slice(0, remaining)
            flow.split(ref, [part])
            ref = part
        self.rows_seen += ref.num_rows
        self.stats.rows_out += ref.num_rows
        flow.deliver(self.index + 1, ref)
        if self.rows_seen >= limit:
            flow.cut_upstream(self.index)
