"""Transforms: the logical map-like operators, and how each runs inside a task.

A transform is both a node of the logical plan (name, resource request,
concurrency cap) and the code an executor runs: ``apply`` turns an iterator of
Arrow tables into another, lazily, so a fused chain of transforms streams a block
through without holding the whole task's output.

A class passed as ``fn`` is a stateful UDF: it is built once per Python worker
process (Spark reuses workers between tasks) and kept in ``_INSTANCES`` under the
operator's id and the task's GPU ids, so a model loads once per worker and device.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from airflow_streambatch.engine.batches import (
    check_batch_format,
    from_udf_output,
    rebatch,
    rows_to_table,
    to_format,
)

# (operator uid, gpu ids) -> constructed stateful UDF, per Python worker process.
_INSTANCES: dict[tuple[str, tuple[str, ...]], Any] = {}


@dataclass(frozen=True)
class Compute:
    """What one task of an operator needs: slots per resource, and a concurrency cap."""

    resources: tuple[tuple[str, float], ...]
    concurrency: int | None = None

    @classmethod
    def make(cls, where: str, num_cpus=None, num_gpus=None, resources=None, concurrency=None) -> Compute:
        for label, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"{where}: {label} must be a number >= 0, got {value!r}")
        if num_cpus is None:
            num_cpus = 0 if num_gpus else 1
        request = {"CPU": float(num_cpus), "GPU": float(num_gpus or 0)}
        for key, value in (resources or {}).items():
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{where}: resources[{key!r}] must be a number >= 0, got {value!r}")
            request[key] = float(value)
        if isinstance(concurrency, tuple):  # Ray's (min, max) actor pool form: we cap at max
            concurrency = concurrency[-1]
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency <= 0):
            raise ValueError(f"{where}: concurrency must be a positive integer, got {concurrency!r}")
        if sum(request.values()) == 0:
            raise ValueError(f"{where}: a task must request some resource (num_cpus, num_gpus or resources)")
        return cls(tuple(sorted((k, v) for k, v in request.items() if v)), concurrency)

    def as_dict(self) -> dict[str, float]:
        return dict(self.resources)


@dataclass
class TaskEnv:
    """What a running task knows about where it runs."""

    gpu_ids: tuple[str, ...] = ()
    task_key: str = ""
    run_id: str = ""
    partitions: tuple[int, ...] = ()
    written: list[tuple[str, int, int]] = field(default_factory=list)  # sink files: (path, rows, bytes)


@dataclass
class Transform:
    """Base of map-like operators. ``apply`` runs on executors."""

    name: str
    compute: Compute
    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def apply(self, tables: Iterator[pa.Table], env: TaskEnv) -> Iterator[pa.Table]:
        raise NotImplementedError


@dataclass
class MapBatches(Transform):
    fn: Any = None
    batch_size: int | None = None
    batch_format: str = "pyarrow"
    fn_args: tuple = ()
    fn_kwargs: dict = field(default_factory=dict)
    fn_constructor_args: tuple = ()
    fn_constructor_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        check_batch_format(self.batch_format, self.name)
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size <= 0):
            raise ValueError(f"{self.name}: batch_size must be a positive integer or None, got {self.batch_size!r}")
        if not callable(self.fn):
            raise TypeError(f"{self.name}: fn must be a function or a class, got {type(self.fn).__name__}")
        if not inspect.isclass(self.fn) and (self.fn_constructor_args or self.fn_constructor_kwargs):
            raise ValueError(f"{self.name}: fn_constructor_args/kwargs apply only when fn is a class")

    @property
    def stateful(self) -> bool:
        return inspect.isclass(self.fn)

    def _callable(self, env: TaskEnv) -> Callable:
        if not self.stateful:
            return self.fn
        key = (self.uid, env.gpu_ids)
        instance = _INSTANCES.get(key)
        if instance is None:
            instance = self.fn(*self.fn_constructor_args, **self.fn_constructor_kwargs)
            _INSTANCES[key] = instance
        return instance

    def apply(self, tables, env):
        fn = self._callable(env)
        for batch in rebatch(tables, self.batch_size):
            out = fn(to_format(batch, self.batch_format), *self.fn_args, **self.fn_kwargs)
            if inspect.isgenerator(out):
                for item in out:
                    yield from_udf_output(item, self.name)
            else:
                yield from_udf_output(out, self.name)


@dataclass
class MapRows(Transform):
    """``map``, ``flat_map`` and ``filter``: a function of one row (a dict)."""

    fn: Any = None
    kind: str = "map"  # map | flat_map | filter

    def __post_init__(self):
        if not callable(self.fn):
            raise TypeError(f"{self.name}: fn must be callable, got {type(self.fn).__name__}")

    def apply(self, tables, env):
        fn, name = self.fn, self.name
        keys = None  # the first output row's keys: every later row of the task must match them
        for table in tables:
            rows = table.to_pylist()
            if self.kind == "filter":
                mask = [bool(fn(row)) for row in rows]
                if any(mask):
                    yield table.filter(pa.array(mask))
                continue
            if self.kind == "map":
                out = [fn(row) for row in rows]
            else:
                out = []
                for row in rows:
                    produced = fn(row)
                    if isinstance(produced, dict) or not hasattr(produced, "__iter__"):
                        raise TypeError(f"{name} must return an iterable of dict rows, got {type(produced).__name__}")
                    out.extend(produced)
            if out:
                if keys is None and isinstance(out[0], dict):
                    keys = frozenset(out[0])
                yield rows_to_table(out, name, keys)


@dataclass
class WriteFiles(Transform):
    """A sink: stages each task's rows as one file of its input partition.

    Yields no rows: the files travel back to the driver as task metadata, and the
    driver commits each partition once all of its tasks are done (`commit.py`).
    """

    path: str = ""
    file_format: str = "parquet"

    def apply(self, tables, env):
        from airflow_streambatch.engine.sinks import write_task_output

        write_task_output(tables, self.path, self.file_format, env)
        yield from ()


def chain(transforms: list[Transform], tables: Iterator[pa.Table], env: TaskEnv) -> Iterator[pa.Table]:
    """Run fused transforms one after another, lazily."""
    for transform in transforms:
        tables = transform.apply(tables, env)
    return tables


def describe(fn) -> str:
    """A function's or class's name for operator names (``MapBatches(embed)``)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def unique_names(names: list[str]) -> list[str]:
    """Disambiguate operator names (``Map(f)``, ``Map(f)#2``) for stats and progress."""
    seen: dict[str, itertools.count] = {}
    out = []
    for name in names:
        counter = seen.setdefault(name, itertools.count(1))
        n = next(counter)
        out.append(name if n == 1 else f"{name}#{n}")
    return out


_SET_BY_US = "STREAMBATCH_SET_CUDA_VISIBLE_DEVICES"


def gpu_env(gpu_ids: tuple[str, ...]) -> None:
    """Expose only the task's GPUs to frameworks that honour CUDA_VISIBLE_DEVICES.

    Workers are reused across operators, so a CPU task undoes what a GPU task set.
    """
    if gpu_ids:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        os.environ[_SET_BY_US] = "1"
    elif os.environ.pop(_SET_BY_US, None):
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
