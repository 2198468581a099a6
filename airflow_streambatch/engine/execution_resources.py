"""Ray Data's ``ExecutionOptions`` (``DataContext.execution_options``) and the
``ExecutionResources`` of its ``resource_limits``.

Why: Ray programs (and Ray's own tests) cap a run with
``DataContext.get_current().execution_options.resource_limits = ExecutionResources(cpu=...,
object_store_memory=...)``, or set one field (``resource_limits.cpu = 1``). Each field maps
to the engine's own setting where one exists, and only ever lowers it, for the run:

* ``cpu`` / ``gpu``: the CPU / GPU slots of the run's resource pool (`execution/resources.py`):
  at most this many, whether the slots come from ``DataContext.resources`` or from Spark.
* ``object_store_memory``: the run's memory budget for blocks in flight, which is
  ``DataContext.memory_limit`` (Ray's object store is where its blocks wait; here they wait
  in ``DataContext.block_dir`` under ``memory_limit``): the smaller of the two.
* ``memory``: accepted and ignored: Ray reserves it for tasks' heap on its nodes; here Spark's
  executor memory is what a task's heap gets (``spark.executor.memory``).

``None`` (the default of each field) is no limit, as in Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

_FIELDS = ("cpu", "gpu", "object_store_memory", "memory")


@dataclass
class ExecutionResources:
    """Limits of one run: ``cpu`` and ``gpu`` slots, ``object_store_memory`` bytes of blocks in
    flight, ``memory`` (accepted; no meaning here). ``None``: no limit."""

    cpu: float | None = None
    gpu: float | None = None
    object_store_memory: float | None = None
    memory: float | None = None

    def __setattr__(self, name: str, value) -> None:
        if name in _FIELDS and value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"ExecutionResources.{name} must be a number >= 0 or None (no limit), got {value!r}")
        super().__setattr__(name, value)

    def copy(self, **changes) -> ExecutionResources:
        """A copy, with ``changes`` to some fields as Ray's ``copy(cpu=1)`` takes them (checked like a
        set field); an unknown name fails naming the fields, not as an unexpected keyword."""
        unknown = sorted(set(changes) - set(_FIELDS))
        if unknown:
            raise ValueError(f"ExecutionResources.copy(): unknown field(s) {unknown}; "
                             f"the fields are {', '.join(_FIELDS)}")
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return ExecutionResources(**values)


def limited_slots(totals: dict[str, float], limits: ExecutionResources) -> dict[str, float]:
    """The pool's slots with ``limits.cpu`` and ``limits.gpu`` applied (never raised)."""
    capped = dict(totals)
    for name, limit in (("CPU", limits.cpu), ("GPU", limits.gpu)):
        if limit is not None and name in capped:
            capped[name] = min(float(capped[name]), float(limit))
    return capped


def limited_memory(memory_limit: int, limits: ExecutionResources) -> int:
    """``DataContext.memory_limit`` with ``limits.object_store_memory`` applied (never raised)."""
    if limits.object_store_memory is None:
        return memory_limit
    return max(1, min(memory_limit, int(limits.object_store_memory)))


@dataclass
class ExecutionOptions:
    """Ray Data's ``DataContext.execution_options``, the part that applies here.

    :param preserve_order: output in input order, the same on every run, and ``limit(n)``
        (``take(n)``) the first ``n`` rows of the input. Off by default, as in Ray Data: a
        block then waits for every block before it (`execution/ordering.py`).
    :param resource_limits: Ray's `ExecutionResources` capping a run: ``cpu``/``gpu`` cap the
        CPU/GPU slots, ``object_store_memory`` caps ``memory_limit``, ``memory`` is accepted
        and ignored (`execution_resources.py`). Default: no limit.
    """

    preserve_order: bool = False
    resource_limits: ExecutionResources = field(default_factory=ExecutionResources)

    def __setattr__(self, name: str, value) -> None:
        if name == "preserve_order" and not isinstance(value, bool):
            raise ValueError(f"DataContext.execution_options.preserve_order must be True or False, got {value!r}")
        if name == "resource_limits":
            if isinstance(value, Mapping):  # a DAG's data_context gives it as JSON
                value = ExecutionResources(**value)
            if not isinstance(value, ExecutionResources):
                raise ValueError("DataContext.execution_options.resource_limits must be an ExecutionResources "
                                 f"(ExecutionResources(cpu=4, object_store_memory=2 << 30)), got {value!r}")
        super().__setattr__(name, value)
