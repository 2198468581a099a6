"""Ray's resource arguments of a read (``num_cpus``, ``num_gpus``, ``memory``, ``ray_remote_args``,
``concurrency``, ``compute``), checked as Ray checks them and turned into the read tasks'
`ResourceRequest`.

Why a module of its own: Ray takes the same arguments on every ``read_*`` function and on
``read_datasource`` (its file reads hand them to ``read_datasource``; here `with_read_resources`
adds them to each built-in ``read_*``), and merges them the same way (``merge_resources_to_ray_remote_args``: an
explicit ``num_cpus=`` wins over ``ray_remote_args["num_cpus"]``). What carries over to Spark is
what the scheduler here can honour: slots per read task (CPU, GPU and custom ``resources``), and
a cap on read tasks running at once (``concurrency``; a ``TaskPoolStrategy``/``ActorPoolStrategy``
``compute``'s size, ``concurrency`` winning when both are given, as Ray's reads document). As in
Ray, ``concurrency`` does not change how many read tasks there are, only how many run at once.
``memory`` and Ray's placement options (``scheduling_strategy``, ``runtime_env``, ...) are checked
and have no effect: Spark's executor settings decide them. An option ``ray.remote`` does not take
is a ``ValueError`` naming it, as Ray's is.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math

from airflow_streambatch.engine.compute import ActorPoolStrategy, TaskPoolStrategy
from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.num_blocks_alias import with_parallelism
from airflow_streambatch.engine.plan.logical import Read, ResourceRequest

# what ``ray.remote`` takes for a task (Ray's ``task_options``)
RAY_TASK_OPTIONS = frozenset({
    "num_cpus", "num_gpus", "resources", "memory", "object_store_memory", "accelerator_type", "label_selector",
    "max_calls", "max_retries", "retry_exceptions", "num_returns", "runtime_env", "scheduling_strategy", "name",
    "placement_group", "placement_group_bundle_index", "placement_group_capture_child_tasks", "_metadata",
    "concurrency_groups", "enable_task_events", "_labels", "_generator_backpressure_num_objects",
})


def read_request(where: str, *, num_cpus=None, num_gpus=None, memory=None, ray_remote_args=None,
                 concurrency=None, compute=None) -> ResourceRequest | None:
    """The read tasks' request; None when no argument asks for anything (one CPU per task, no cap)."""
    if ray_remote_args is not None and not isinstance(ray_remote_args, dict):
        raise TypeError(f"{where}: ray_remote_args must be a dict of ray.remote options, got "
                        f"{type(ray_remote_args).__name__}")
    args = dict(ray_remote_args or {})
    unknown = sorted(set(args) - RAY_TASK_OPTIONS)
    if unknown:
        raise ValueError(f"{where}: Invalid option keyword {unknown[0]} for remote functions in ray_remote_args. "
                         f"Valid ones are {sorted(RAY_TASK_OPTIONS)}.")
    for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus), ("memory", memory)):
        if value is not None:
            args[name] = value  # Ray's merge: the explicit argument wins
    resources = args.get("resources")
    if resources is not None and not isinstance(resources, dict):
        raise TypeError(f"{where}: ray_remote_args['resources'] must be a dict of resource name to amount, "
                        f"got {resources!r}")
    memory = args.get("memory")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float)) or memory < 0):
        raise ValueError(f"{where}: memory must be a number of bytes >= 0, got {memory!r}")
    cap = _read_cap(where, concurrency, compute)
    if args.get("num_cpus") is None and args.get("num_gpus") is None and not resources and cap is None:
        return None
    return ResourceRequest.make(where, args.get("num_cpus"), args.get("num_gpus"), resources, cap)


def _read_cap(where: str, concurrency, compute) -> int | None:
    """Read tasks running at once at most: ``concurrency``, else ``compute``'s size, else no cap."""
    if concurrency is not None:
        check_positive_int(concurrency, f"{where}: concurrency")
        return concurrency
    if compute is None or compute == "tasks":
        return None
    if isinstance(compute, TaskPoolStrategy):
        return compute.size
    if isinstance(compute, ActorPoolStrategy):
        return None if compute.max_size == math.inf else int(compute.max_size)
    raise ValueError(f"{where}: compute must be a TaskPoolStrategy or an ActorPoolStrategy, got {compute!r}")


READ_RESOURCE_ARGS = ("num_cpus", "num_gpus", "memory", "ray_remote_args", "concurrency")  # Ray's file reads' own


def with_read_resources(read_fn):
    """``read_fn`` (a built-in ``read_*``) taking Ray's ``num_cpus=``, ``num_gpus=``, ``memory=``,
    ``ray_remote_args=`` and ``concurrency=`` as Ray's file reads take them (no ``compute=``: Ray's
    file reads have none): checked by `read_request` under the function's name before anything
    is listed, then set as the request of the dataset's read tasks. Nothing is read here."""
    where = read_fn.__name__
    read_fn = with_parallelism(read_fn)  # Ray's deprecated ``parallelism=`` too (`num_blocks_alias.py`)

    @functools.wraps(read_fn)
    def read(*args, num_cpus=None, num_gpus=None, memory=None, ray_remote_args=None, concurrency=None, **kwargs):
        request = read_request(where, num_cpus=num_cpus, num_gpus=num_gpus, memory=memory,
                               ray_remote_args=ray_remote_args, concurrency=concurrency)
        dataset = read_fn(*args, **kwargs)
        if request is None:
            return dataset
        source, *rest = dataset._logical
        if not isinstance(source, Read):
            raise TypeError(f"{where}: with_read_resources needs a dataset that starts with a Read")
        return type(dataset)([dataclasses.replace(source, compute=request), *rest], dataset._context)

    signature = inspect.signature(read_fn)
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in READ_RESOURCE_ARGS]
    params += [p for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD]
    read.__signature__ = signature.replace(parameters=params)
    read.__doc__ = (read_fn.__doc__ or "") + (
        "\n\n    Ray's ``num_cpus``, ``num_gpus``, ``memory``, ``ray_remote_args`` and ``concurrency``: each read "
        "task's slots\n    and a cap on read tasks running at once (`read_resources.with_read_resources`).")
    return read
