"""Where a run's tasks run: the backend that launches them, the control plane they call
back on, and the slots they may take.

The executor is handed one (`StreamingExecutor.start`), so its loop is the same whether
Spark runs the tasks (`spark_runtime`, what every user gets) or a backend in the test's
own process does (the loop tests). Everything here that needs Spark happens before the
run exists: a cluster that cannot place the run's tasks fails now, naming the setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.execution_resources import limited_slots
from airflow_streambatch.engine.execution.control_server import ControlServer, control_server
from airflow_streambatch.engine.execution.resources import ResourcePool
from airflow_streambatch.engine.plan.planner import PhysicalOp
from airflow_streambatch.engine.protocol.backend import Backend
from airflow_streambatch.engine.spark.backend import SparkBackend
from airflow_streambatch.engine.spark.connect import (
    check_connect_session,
    connect_slots,
    connect_task_slots,
    is_connect,
)
from airflow_streambatch.engine.spark.connect_backend import ConnectBackend
from airflow_streambatch.engine.spark.connect_profiles import check_connect_stage_scheduling
from airflow_streambatch.engine.spark.profiles import check_stage_scheduling, spark_assigns_gpus
from airflow_streambatch.engine.spark.session import (
    get_spark,
    master_of,
    ship_package,
    slots_from_spark,
    spark_task_slots,
)


@dataclass
class Runtime:
    """What a run is given by where it runs.

    ``host_agents``: blocks stay on the hosts of the tasks that wrote them and those hosts'
    agents serve them (a cluster); ``False`` where every task shares the driver's host.
    ``backend``: makes the run's backend, given the tag its jobs carry.
    """

    control: ControlServer
    pool: ResourcePool
    host_agents: bool
    backend: Callable[[str], Backend]


def spark_runtime(ctx: DataContext, ops: list[PhysicalOp]) -> Runtime:
    """The active Spark application (started when there is none) as a run's runtime."""
    spark = get_spark(min_slots=int(sum((ctx.resources or {}).values())))
    ship_package(spark)
    control = control_server(spark, ctx)
    requests = {op.name: op.compute.as_dict() for op in ops if op.runs_tasks}
    if is_connect(spark):
        return _connect_runtime(spark, ctx, control, requests)
    check_stage_scheduling(spark, requests)  # a cluster that cannot place these tasks fails now, by setting
    pool = ResourcePool(limited_slots(ctx.resources or slots_from_spark(spark, requests.values()),
                                      ctx.execution_options.resource_limits), spark_task_slots(spark),
                        assign_gpus=not spark_assigns_gpus(spark))
    return Runtime(control, pool, host_agents=not spark.sparkContext.master.startswith("local"),
                   backend=lambda tag: SparkBackend(spark, tag))


_checked: set[tuple[str, str]] = set()  # (Connect session, control plane) that passed the start-up check


def _connect_runtime(spark, ctx: DataContext, control: ControlServer, requests: dict) -> Runtime:
    """A Spark Connect session as a run's runtime (`spark/connect.py`): checked once per session and
    control plane, since the check is a job of its own."""
    local = master_of(spark).startswith("local")
    task_slots = connect_task_slots(spark)
    pool = ResourcePool(limited_slots(ctx.resources or connect_slots(spark, requests.values(), task_slots),
                                      ctx.execution_options.resource_limits), task_slots,
                        assign_gpus=local)  # on a cluster Spark assigns GPUs, by the operators' profiles
    if (spark.session_id, control.uri) not in _checked:
        check_connect_session(spark, control.host, control.port, task_slots)
        _checked.add((spark.session_id, control.uri))
    profiles = check_connect_stage_scheduling(spark, requests)  # fails now, by setting, what cannot be placed
    return Runtime(control, pool, host_agents=not local, backend=lambda tag: ConnectBackend(spark, tag, profiles))
