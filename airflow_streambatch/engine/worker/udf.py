"""How transforms run inside a task, on executors: UDF calls, stateful UDF instances,
and the GPUs a task may see. Plan nodes (`plan/logical.py`) delegate here.

A class passed as ``fn`` (to ``map_batches``, ``map``, ``flat_map`` or ``filter``)
is a stateful UDF: it is built once per Python worker process (Spark reuses workers
between tasks) and kept there, so a model loads once per worker and device, not per task.

With ``concurrency`` (``n``, or an actor pool's maximum), the class is Ray's actor pool
of at most ``n`` actors: at most ``n`` instances of the operator are *live* at once in
the whole application, per run, whichever Python workers and hosts they are in. An
instance is built only under a slot the driver grants, and an idle one is deleted (then
``gc.collect()`` and, where torch uses CUDA, ``torch.cuda.empty_cache()``) when a task in
another worker needs the slot, and when the run ends (`instance_lease.py`). Instances
whose worker holds them already cost no call to the driver.

Without ``concurrency`` an instance is kept in ``_INSTANCES`` under the operator's id and
the task's GPU ids until its worker exits, as before; so is one that runs outside the
engine's executor (no control plane to ask).
"""

from __future__ import annotations

import inspect
import itertools
import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from airflow_streambatch.engine.worker.batches import check_rows, from_udf_output, rebatch, rows_to_table, to_format
from airflow_streambatch.engine.worker.tensors import table_rows
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.worker.build_ahead import construct, start_builds, take_uncapped
from airflow_streambatch.engine.worker.instance_lease import Lease, end_task, instance_for
from airflow_streambatch.engine.worker.row_errors import guarded, set_aside

# (operator uid, gpu ids) -> constructed stateful UDF without a concurrency cap, per Python worker process.
_INSTANCES: dict[tuple[str, tuple[str, ...]], Any] = {}


@dataclass
class TaskEnv:
    """What a running task knows about where it runs."""

    gpu_ids: tuple[str, ...] = ()
    task_key: str = ""
    run_id: str = ""
    partitions: tuple[int, ...] = ()
    written: list[tuple[str, int, int]] = field(default_factory=list)  # sink files: (path, rows, bytes)
    control: ControlInfo | None = None  # the driver's control plane: capped stateful UDFs get slots there
    leases: list[Lease] = field(default_factory=list)  # capped instances this task uses
    builds: int = 0  # stateful UDF instances (model copies) this task built
    build_s: float = 0.0  # seconds it spent building them: a cold start, reported by `Dataset.stats()`
    build_ahead_s: float = 0.0  # of those, seconds built ahead of it (`instance_lease.build_ahead`), not waited for
    input_label: str | None = None  # the task's input partition, named in rows set aside (`row_errors.py`)
    set_aside: list[dict] = field(default_factory=list)  # rows a function failed on, with on_error="quarantine"
    dead_letter: str | None = None  # the write's path, where those rows are staged

    def count_build(self, build_s: float, waited_s: float | None = None) -> None:
        """A model copy this task built, in ``build_s``; or one built ahead of it
        (`build_ahead.py`), of whose ``build_s`` the task waited ``waited_s``."""
        self.builds += 1
        self.build_s += build_s
        if waited_s is not None:
            self.build_ahead_s += max(0.0, build_s - waited_s)

    def end_task(self) -> None:
        """The task is over: its capped instances go idle, or are released if the driver wants them."""
        leases, self.leases = self.leases, []
        end_task(leases)


def _udf(transform, env: TaskEnv) -> Callable:
    """The function to call: ``fn`` itself, or this worker's instance of a stateful UDF class."""
    if not inspect.isclass(transform.fn):
        return transform.fn

    def build():
        start = time.perf_counter()
        try:
            return construct(transform)
        finally:
            env.count_build(time.perf_counter() - start)

    if transform.compute.concurrency is not None and env.control is not None:
        return instance_for(transform, env, build)
    key = (transform.uid, env.gpu_ids)
    instance = _INSTANCES.get(key)
    if instance is None:
        ahead = take_uncapped(key)
        if ahead is None:
            instance = _INSTANCES[key] = build()
        else:  # its build counts here, in the first task that uses it
            instance, build_s, waited_s = ahead
            _INSTANCES[key] = instance
            env.count_build(build_s, waited_s)
    return instance


def build_ahead_of_tasks(op) -> None:
    """Start the builds ahead that ``op``'s payload lists (`build_ahead.py`)."""
    start_builds(op.build_ahead, {t.uid for t in op.transforms}, op.control, op.run_id, _INSTANCES)


def map_batches(transform, tables: Iterator[pa.Table], env: TaskEnv) -> Iterator[pa.Table]:
    """``MapBatches``: the UDF over batches of ``batch_size`` rows in ``batch_format``. A class is
    looked up once the first batch is made: a build ahead (`build_ahead.py`) overlaps making it."""
    batches = rebatch(tables, transform.batch_size)
    first = next(batches, None)
    if first is None:
        return
    batches = itertools.chain([first], batches)
    fn = _udf(transform, env)

    def call(batch: pa.Table) -> Iterator[pa.Table]:
        out = fn(_udf_batch(batch, transform), *transform.fn_args, **transform.fn_kwargs)
        if not inspect.isgenerator(out):
            yield from_udf_output(out, transform.name)
            return
        for item in out:
            yield from_udf_output(item, transform.name)

    if transform.threads > 1 and transform.dead_letter is None:
        yield from _concurrently(lambda b: list(call(b)), batches, transform.threads)
        return
    for batch in batches:
        if transform.dead_letter is None:
            yield from call(batch)
        else:  # each output whole before any goes on: a failing call's partial output is made again by halves
            yield from guarded(lambda b: list(call(b)), batch, transform, env)


def _udf_batch(batch: pa.Table, transform):
    """The batch ``fn`` gets: with Ray's default ``zero_copy_batch=False`` its NumPy arrays are
    writable (copied where Arrow's memory is read-only), so ``batch["x"] += 1`` works as in Ray."""
    data = to_format(batch, transform.batch_format)
    if transform.zero_copy_batch or not isinstance(data, dict):
        return data
    return {name: np.require(values, requirements="W") if isinstance(values, np.ndarray) else values
            for name, values in data.items()}


def _concurrently(call: Callable[[pa.Table], list], batches: Iterator[pa.Table], threads: int
                  ) -> Iterator[pa.Table]:
    """``call`` on up to ``threads`` batches at once (Ray's ``max_concurrency``: threads per actor,
    sharing its instance); outputs in input order, and at most ``threads`` batches in flight."""
    with ThreadPoolExecutor(threads, thread_name_prefix="udf") as pool:
        pending: deque = deque()
        for batch in batches:
            pending.append(pool.submit(call, batch))
            if len(pending) >= threads:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()


def _row_udf(transform, env: TaskEnv) -> Callable[[dict], Any]:
    """``row -> fn(row, *fn_args, **fn_kwargs)``, ``fn`` being this worker's instance of a class."""
    fn, args, kwargs = _udf(transform, env), transform.fn_args, transform.fn_kwargs
    return (lambda row: fn(row, *args, **kwargs)) if args or kwargs else fn


_SET_ASIDE = object()  # in place of the result of a call that failed and whose row was set aside


def _guarded_rows(fn, rows: list[dict], transform, env) -> list:
    """``fn(row)`` for each row; with on_error="quarantine" a row ``fn`` raises on is set aside."""
    if transform.dead_letter is None:
        return [fn(row) for row in rows]
    out = []
    for row in rows:
        try:
            out.append(fn(row))
        except Exception as exc:  # noqa: BLE001 - user code
            set_aside(env, transform, row, exc)
            out.append(_SET_ASIDE)
    return out


def filter_rows(transform, tables: Iterator[pa.Table], env: TaskEnv) -> Iterator[pa.Table]:
    """``filter``: keep the rows (dicts) for which the function is true."""
    fn = _row_udf(transform, env)
    for table in tables:
        mask = [keep is True for keep in _guarded_rows(lambda row: bool(fn(row)), table_rows(table), transform, env)]
        if any(mask):
            yield table.filter(pa.array(mask))


def _one_row(produced, name: str) -> list:
    return [produced]


def _rows_of(produced, name: str) -> list:
    if isinstance(produced, dict) or not hasattr(produced, "__iter__"):
        raise TypeError(f"{name} must return an iterable of dict rows, got {type(produced).__name__}")
    return list(produced)


def _rows_to_tables(transform, tables: Iterator[pa.Table], rows_of, env: TaskEnv) -> Iterator[pa.Table]:
    keys = None  # the first output row's keys: every later row of the task must match them
    fn = _row_udf(transform, env)

    def produce(row: dict) -> list:
        nonlocal keys
        out = rows_of(fn(row), transform.name)
        if transform.dead_letter is not None and out:  # a row that returns other keys is set aside too
            check_rows(out, transform.name, keys if keys is not None else _keys(out[0]))
            keys = keys if keys is not None else _keys(out[0])
        return out

    for table in tables:
        out = [row for rows in _guarded_rows(produce, table_rows(table), transform, env) if rows is not _SET_ASIDE
               for row in rows]
        if out:
            if keys is None:
                keys = _keys(out[0])
            yield rows_to_table(out, transform.name, keys)


def _keys(row) -> frozenset | None:
    return frozenset(row) if isinstance(row, dict) else None


def map_rows(transform, tables: Iterator[pa.Table], env: TaskEnv) -> Iterator[pa.Table]:
    """``map``: one output row (a dict) per input row."""
    return _rows_to_tables(transform, tables, _one_row, env)


def flat_map_rows(transform, tables: Iterator[pa.Table], env: TaskEnv) -> Iterator[pa.Table]:
    """``flat_map``: any number of output rows per input row."""
    return _rows_to_tables(transform, tables, _rows_of, env)


ROW_OPERATIONS = {"map": map_rows, "flat_map": flat_map_rows, "filter": filter_rows}


def chain(transforms: list, tables: Iterator[pa.Table], env: TaskEnv) -> Iterator[pa.Table]:
    """Run fused transforms one after another, lazily."""
    for transform in transforms:
        tables = transform.apply(tables, env)
    return tables


# a device in CUDA_VISIBLE_DEVICES: an index or a GPU/MIG UUID; CUDA ignores the list from the first that is not
_DEVICE = re.compile(r"\d+|(GPU|MIG)-[\w/-]+")


def visible_devices(value: str) -> list[str]:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value names, as CUDA reads it: up to the first entry
    that is not a device (``-1``, ``none``), so ``""`` and ``"-1"`` name none."""
    devices = []
    for entry in value.split(","):
        entry = entry.strip()
        if not _DEVICE.fullmatch(entry):
            break
        devices.append(entry)
    return devices


_SET_BY_US = "STREAMBATCH_SET_CUDA_VISIBLE_DEVICES"  # holds what the worker inherited ("" for nothing)


def gpu_env(gpu_ids: tuple[str, ...], local: bool = False) -> None:
    """Expose only the task's GPUs to frameworks that honour CUDA_VISIBLE_DEVICES.

    Workers are reused across operators, so a CPU task restores what a GPU task changed.
    In local mode the driver numbers the machine's GPUs 0..n-1 as CUDA does, that is over
    the devices the worker inherited (``CUDA_VISIBLE_DEVICES=2,3``: 0 is device 2), so
    ``local`` ids are positions in that list; on a cluster they are Spark's addresses.
    """
    inherited = os.environ.get(_SET_BY_US)
    if inherited is None:
        inherited = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if gpu_ids:
        devices = visible_devices(inherited)
        if local and devices:
            gpu_ids = tuple(devices[int(i)] if i.isdigit() and int(i) < len(devices) else i for i in gpu_ids)
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
        os.environ[_SET_BY_US] = inherited
    elif _SET_BY_US in os.environ:
        os.environ.pop(_SET_BY_US)
        if inherited:
            os.environ["CUDA_VISIBLE_DEVICES"] = inherited
        else:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)


# For other transforms that call a user's function as ``map_batches`` does (``map_groups``, `sorting.py`).
udf_for, udf_batch = _udf, _udf_batch
