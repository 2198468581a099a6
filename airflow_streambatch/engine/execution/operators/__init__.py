"""Runtime operators, one class per kind of physical operator (`plan/planner.py`)."""

from __future__ import annotations

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.execution.operators.base import Operator
from airflow_streambatch.engine.execution.operators.input_blocks import InputBlocksOperator
from airflow_streambatch.engine.execution.operators.limit import LimitOperator
from airflow_streambatch.engine.execution.operators.map import MapOperator
from airflow_streambatch.engine.execution.operators.read import ReadOperator
from airflow_streambatch.engine.execution.operators.repartition import RepartitionOperator
from airflow_streambatch.engine.execution.operators.sort import SortOperator
from airflow_streambatch.engine.execution.resources import ResourcePool
from airflow_streambatch.engine.plan.planner import (
    InputBlocksOp,
    LimitOp,
    MapOp,
    PhysicalOp,
    ReadOp,
    RepartitionOp,
    SortOp,
)

OPERATORS: dict[type[PhysicalOp], type[Operator]] = {
    ReadOp: ReadOperator,
    InputBlocksOp: InputBlocksOperator,
    MapOp: MapOperator,
    LimitOp: LimitOperator,
    RepartitionOp: RepartitionOperator,
    SortOp: SortOperator,
}


def build_operators(ops: list[PhysicalOp], ctx: DataContext, pool: ResourcePool) -> list[Operator]:
    """The runtime operator of each physical one, each knowing its downstream task runners."""
    operators = [OPERATORS[type(op)](i, op, ctx, pool) for i, op in enumerate(ops)]
    for op in operators:
        op.downstream = [d for d in operators[op.index + 1:] if d.runs_tasks]
    return operators


__all__ = ["LimitOperator", "MapOperator", "Operator", "RepartitionOperator", "SortOperator", "build_operators"]
