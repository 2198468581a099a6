"""The logical plan: a chain of one source, then transforms, limits and repartitions.

A transform is a plan node (name, resource request, concurrency cap) whose
``apply`` turns an iterator of Arrow tables into another, lazily, so a fused chain
streams a block through without holding a task's whole output. What ``apply``
runs on executors lives in `worker/` (`worker/udf.py`, `worker/sinks.py`).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.plan.datasource import Datasource
from airflow_streambatch.engine.worker import udf
from airflow_streambatch.engine.worker.batches import DEFAULT_BATCH_FORMAT, check_batch_format
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.worker.sinks import SinkOptions, write_task_output


@dataclass(frozen=True)
class ResourceRequest:
    """What one task of an operator needs: slots per resource, and a concurrency cap."""

    resources: tuple[tuple[str, float], ...]
    concurrency: int | None = None

    @classmethod
    def make(cls, where: str, num_cpus=None, num_gpus=None, resources=None, concurrency=None,
             fn=None) -> ResourceRequest:
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
        concurrency = _max_concurrency(where, concurrency, fn)
        if sum(request.values()) == 0:
            raise ValueError(f"{where}: a task must request some resource (num_cpus, num_gpus or resources)")
        return cls(tuple(sorted((k, v) for k, v in request.items() if v)), concurrency)

    def as_dict(self) -> dict[str, float]:
        return dict(self.resources)


def _max_concurrency(where: str, concurrency, fn) -> int | None:
    """The cap on running tasks, from Ray Data's forms: ``n``, or for a class an actor pool
    ``(min, max)`` or ``(min, max, initial)``, checked as Ray checks them. Spark starts Python
    workers itself, so a pool's minimum and initial sizes have no effect here: only its maximum does."""
    if concurrency is not None and not isinstance(concurrency, (int, tuple)):  # Ray's sentence, then ours
        raise ValueError(f"{where}: ``concurrency`` is expected to be set as an integer or a tuple of integers, "
                         f"but got: {concurrency!r}; use n, (min, max) or (min, max, initial)")
    if not isinstance(concurrency, tuple):
        check_positive_int(concurrency, f"{where}: concurrency", allow_none=True)
        return concurrency
    if fn is not None and not inspect.isclass(fn):
        raise ValueError(f"{where}: ``concurrency`` is set as a tuple of integers, but ``fn`` is not a callable "
                         f"class (Ray's words): concurrency={concurrency!r} is a tuple (an actor pool), but fn is not "
                         "a callable class; use concurrency=n to cap the number of tasks running at once")
    if len(concurrency) not in (2, 3):
        raise ValueError(f"{where}: ``concurrency`` is expected to be set as an integer or a tuple of integers, "
                         f"but got: {concurrency!r}; concurrency must be n, (min, max) or (min, max, initial)")
    for value in concurrency:
        check_positive_int(value, f"{where}: each value of concurrency={concurrency!r}")
    low, high = concurrency[:2]
    if low > high or (len(concurrency) == 3 and not low <= concurrency[2] <= high):
        raise ValueError(f"{where}: ``concurrency`` is expected to be set as a tuple of integers, but got: "
                         f"{concurrency!r}, which needs min <= initial <= max")
    return high


@dataclass
class Transform:
    """Base of map-like operators. ``apply`` runs on executors."""

    name: str
    compute: ResourceRequest
    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    on_error: str | None = None  # "fail" | "quarantine"; None: DataContext.on_row_error (`plan/row_errors.py`)
    dead_letter: str | None = None  # set when planned: the write's path, where its failing rows are set aside
    max_task_retries: int | None = None  # this operator's retries (-1: no limit); None: DataContext's (`compute.py`)

    def apply(self, tables: Iterator[pa.Table], env: udf.TaskEnv) -> Iterator[pa.Table]:
        raise NotImplementedError


@dataclass
class MapBatches(Transform):
    fn: Any = None
    batch_size: int | None = None
    batch_format: str | None = DEFAULT_BATCH_FORMAT
    fn_args: tuple = ()
    fn_kwargs: dict = field(default_factory=dict)
    fn_constructor_args: tuple = ()
    fn_constructor_kwargs: dict = field(default_factory=dict)
    zero_copy_batch: bool = False  # Ray's: False hands fn writable NumPy arrays (a copy where Arrow's are read-only)
    threads: int = 1  # a class's calls run at once per task (Ray's max_concurrency, `engine/compute.py`)

    def __post_init__(self):
        check_batch_format(self.batch_format, self.name)
        check_positive_int(self.batch_size, f"{self.name}: batch_size", allow_none=True)
        if not callable(self.fn):
            raise TypeError(f"{self.name}: fn must be a function or a class, got {type(self.fn).__name__}")
        if not inspect.isclass(self.fn) and (self.fn_constructor_args or self.fn_constructor_kwargs):
            raise ValueError(f"{self.name}: fn_constructor_args/kwargs apply only when fn is a class")

    def apply(self, tables, env):
        return udf.map_batches(self, tables, env)


@dataclass
class MapRows(Transform):
    """``map``, ``flat_map`` and ``filter``: a function of one row (a dict), or a class built once per
    worker (as for ``map_batches``) whose instances are called with each row."""

    fn: Any = None
    kind: str = "map"  # map | flat_map | filter
    fn_args: tuple = ()
    fn_kwargs: dict = field(default_factory=dict)
    fn_constructor_args: tuple = ()
    fn_constructor_kwargs: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in udf.ROW_OPERATIONS:
            raise ValueError(f"{self.name}: kind must be one of {sorted(udf.ROW_OPERATIONS)}, got {self.kind!r}")
        if not callable(self.fn):
            raise TypeError(f"{self.name}: fn must be callable, got {type(self.fn).__name__}")
        if not inspect.isclass(self.fn) and (self.fn_constructor_args or self.fn_constructor_kwargs):
            raise ValueError(f"{self.name}: fn_constructor_args/kwargs apply only when fn is a class")

    def apply(self, tables, env):
        return udf.ROW_OPERATIONS[self.kind](self, tables, env)


@dataclass
class WriteFiles(Transform):
    """A sink: stages each task's rows as one file of its input partition.

    Yields no rows: the files travel back to the driver as task metadata, and the
    driver commits each partition once all of its tasks are done (`output/commit.py`).
    """

    path: str = ""
    file_format: str = "parquet"
    options: SinkOptions = field(default_factory=SinkOptions)
    staged: bool = True  # False: a table's data files, written where they stay (`output/tables.py`)

    def apply(self, tables, env):
        write_task_output(tables, self.path, self.file_format, env, self.options, self.staged)
        yield from ()


def sink_min_rows(transforms: list[Transform]) -> int:
    """Rows a task of these fused transforms should bundle for its sink (``min_rows_per_file``), else 0."""
    return max([t.options.min_rows_per_file or 0 for t in transforms if isinstance(t, WriteFiles)], default=0)


@dataclass(frozen=True)
class Read:
    datasource: Datasource
    override_num_blocks: int | None = None
    compute: ResourceRequest | None = None  # the read tasks' (Ray's num_cpus/concurrency on a read); None: 1 CPU


@dataclass(frozen=True)
class InputBlocks:
    """Blocks that already exist (a materialized dataset), with the lineage to rebuild them.

    ``owner`` is the object whose finalizer deletes the blocks: every dataset built on
    these blocks holds this op, and so keeps them alive while it can still read them.
    """

    blocks: tuple[BlockRef, ...]
    lineage: dict = field(default_factory=dict, hash=False, compare=False)
    owner: object = field(default=None, hash=False, compare=False, repr=False)
    source: object = field(default=None, hash=False, compare=False, repr=False)  # the Read they came from
    union_of: tuple | None = field(default=None, hash=False, compare=False, repr=False)  # a union's Reads


@dataclass(frozen=True)
class Limit:
    n: int


@dataclass(frozen=True)
class Repartition:
    """``num_blocks`` near-equal blocks; or, with ``rows_per_block``, blocks of exactly that many rows
    but the last; ``shuffle``: each output block takes a slice of every input block, as Ray's
    ``repartition(shuffle=True)`` cuts them."""

    num_blocks: int | None  # None with shuffle: as many as the input has (``random_shuffle``)
    rows_per_block: int | None = None
    shuffle: bool = False
    reduce: Transform | None = field(default=None, compare=False)  # run by each output task (`plan/shuffle.py`)
    by_group: bool = False  # output block j joins the input blocks placed (j, ...) (``zip``)




LogicalOp = Read | InputBlocks | Transform | Limit | Repartition


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
