"""Ray Data's custom datasources: subclass `Datasource`, return `ReadTask` items from
``get_read_tasks(parallelism)``, and read it with `read_datasource`.

``get_read_tasks`` runs in the driver when the dataset is planned, as in Ray; each
`ReadTask` becomes one input partition of this engine, its ``read_fn`` run on a Spark
executor (so it, and what it closes over, must pickle, as Ray requires too). Its
`BlockMetadata` is a hint: ``size_bytes`` sizes the task, and ``num_rows``,
``input_files`` and the source's name fingerprint it for commit records; the blocks it
yields (`pyarrow.Table`, `pandas.DataFrame` or a dict of columns) are measured as they
come. Ray's older interfaces still work: ``prepare_read(parallelism, **read_args)`` and
``create_reader(**read_args)`` returning a `Reader`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa

from airflow_streambatch.engine.block import BlockMetadata
from airflow_streambatch.engine.dataset import Dataset
from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.plan import datasource as plan_source
from airflow_streambatch.engine.plan.logical import Read
from airflow_streambatch.engine.read_resources import read_request
from airflow_streambatch.engine.worker.batches import from_udf_output


class Datasource:
    """Base of a custom datasource (Ray's ``ray.data.Datasource``): implement ``get_read_tasks``
    and, optionally, ``estimate_inmemory_data_size`` (its bytes in memory, or None)."""

    def get_name(self) -> str:
        """How operators and logs name it: the class name without a ``Datasource`` suffix."""
        name = type(self).__name__
        return name[: -len("Datasource")] if name.endswith("Datasource") and name != "Datasource" else name

    def estimate_inmemory_data_size(self) -> int | None:
        raise NotImplementedError

    def get_read_tasks(self, parallelism: int) -> list[ReadTask]:
        raise NotImplementedError

    def prepare_read(self, parallelism: int, **read_args) -> list[ReadTask]:
        """Ray's deprecated form of ``get_read_tasks``."""
        raise NotImplementedError

    def create_reader(self, **read_args) -> Reader:
        """Ray's deprecated reader interface; by default it calls ``prepare_read``."""
        return _PrepareReadReader(self, read_args)

    @property
    def supports_distributed_reads(self) -> bool:
        """Ray runs a source that returns False on the driver's node; here every read runs on executors."""
        return True


class Reader:
    """Ray's deprecated bound read: ``get_read_tasks(parallelism)`` and ``estimate_inmemory_data_size``."""

    def estimate_inmemory_data_size(self) -> int | None:
        raise NotImplementedError

    def get_read_tasks(self, parallelism: int) -> list[ReadTask]:
        raise NotImplementedError


class _PrepareReadReader(Reader):
    def __init__(self, source: Datasource, read_args: dict):
        self._source, self._read_args = source, read_args

    def estimate_inmemory_data_size(self) -> int | None:
        return None

    def get_read_tasks(self, parallelism: int) -> list[ReadTask]:
        return self._source.prepare_read(parallelism, **self._read_args)


class ReadTask:
    """One input partition of a custom source: ``read_fn()`` returns (or yields) its blocks.

    ``metadata`` describes all of them together (a hint, see the module doc); ``schema``
    is current Ray's place for the schema; ``per_task_row_limit`` stops the task after
    that many rows.
    """

    def __init__(self, read_fn: Callable[[], Iterable], metadata: BlockMetadata, schema=None,
                 per_task_row_limit: int | None = None):
        if not callable(read_fn):
            raise TypeError(f"ReadTask: read_fn must be callable, got {type(read_fn).__name__}")
        if not isinstance(metadata, BlockMetadata):
            raise TypeError("ReadTask: metadata must be an airflow_streambatch.engine.block.BlockMetadata, "
                            f"got {type(metadata).__name__}")
        self._read_fn, self._metadata = read_fn, metadata
        self.schema = schema if schema is not None else metadata.schema
        self.per_task_row_limit = per_task_row_limit

    @property
    def metadata(self) -> BlockMetadata:
        return self._metadata

    @property
    def read_fn(self) -> Callable[[], Iterable]:
        return self._read_fn

    def __call__(self) -> Iterator:
        result = self._read_fn()
        if isinstance(result, (pa.Table, pa.RecordBatch, dict)) or type(result).__name__ == "DataFrame":
            yield result  # one block returned bare (Ray expects an iterable of blocks; this is what was meant)
            return
        yield from result


def read_datasource(datasource: Datasource, *, parallelism: int = -1, num_cpus: float | None = None,
                    num_gpus: float | None = None, memory: float | None = None, ray_remote_args: dict | None = None,
                    concurrency: int | None = None, compute=None, override_num_blocks: int | None = None,
                    **read_args) -> Dataset:
    """A dataset of what ``datasource``'s read tasks yield, one input partition per `ReadTask`.

    ``get_read_tasks`` is asked for ``override_num_blocks`` tasks (or Ray's deprecated
    ``parallelism`` when positive), else for as many as the engine would make for
    ``estimate_inmemory_data_size()`` bytes: two per execution slot at least, and none over
    ``DataContext.target_max_block_size``. ``read_args`` go to a legacy ``prepare_read`` or
    ``create_reader``; a source with ``get_read_tasks`` takes none (a ``TypeError`` names them).
    Ray's ``num_cpus``, ``num_gpus``, ``ray_remote_args`` (its ``num_cpus``, ``num_gpus``,
    ``resources``) are each read task's slots, and ``concurrency`` (or ``compute``'s size) caps the
    read tasks running at once; ``memory`` and Ray's placement options are checked only
    (`read_resources.py`).
    """
    request = read_request("read_datasource", num_cpus=num_cpus, num_gpus=num_gpus, memory=memory,
                           ray_remote_args=ray_remote_args, concurrency=concurrency, compute=compute)
    if not isinstance(datasource, Datasource) and not hasattr(datasource, "get_read_tasks"):
        raise TypeError(f"read_datasource expects a Datasource (airflow_streambatch.engine.datasource.Datasource), "
                        f"got {type(datasource).__name__}")
    if override_num_blocks is None and isinstance(parallelism, int) and parallelism > 0:
        override_num_blocks = parallelism
    check_positive_int(override_num_blocks, "read_datasource: override_num_blocks", allow_none=True)
    reader = _reader(datasource, read_args)
    name = datasource.get_name() if hasattr(datasource, "get_name") else type(datasource).__name__

    def plan(slots: int, override: int | None, target_bytes: int) -> list[plan_source.ReadTask]:
        estimate = _estimate(reader)
        wanted = override or plan_source.partition_count(estimate or 0, 1 << 30, slots, None, target_bytes)
        tasks = list(reader.get_read_tasks(wanted))
        wrong = [type(t).__name__ for t in tasks if not isinstance(t, ReadTask)]
        if wrong:
            raise TypeError(f"read_datasource: {name}.get_read_tasks must return ReadTask items, got {wrong[:3]}")
        if not tasks:  # a source without data: one task that yields nothing, as range(0) plans
            return [plan_source.ReadTask(f"{name}[empty]", 0, _no_blocks, plan_source.fingerprint([name, "empty"]))]
        share = (estimate or 0) // len(tasks)
        return [plan_source.ReadTask(f"{name}[{i}]", task.metadata.size_bytes or share, _read(task, name),
                                     plan_source.fingerprint([name, i, task.metadata.num_rows,
                                                              task.metadata.size_bytes, task.metadata.input_files]),
                                     files=tuple(task.metadata.input_files or ()))
                for i, task in enumerate(tasks)]

    return Dataset([Read(plan_source.Datasource(name, plan), override_num_blocks, request)])


def _reader(datasource, read_args: dict):
    """What lists the read tasks: the source itself, or (Ray's legacy interfaces) its reader."""
    kind = type(datasource)
    if getattr(kind, "get_read_tasks", None) is not Datasource.get_read_tasks:
        if read_args:
            raise TypeError(f"read_datasource: unexpected arguments {sorted(read_args)} for {kind.__name__}; "
                            "they are passed only to a legacy prepare_read/create_reader")
        return datasource
    if kind.prepare_read is Datasource.prepare_read and kind.create_reader is Datasource.create_reader:
        raise TypeError(f"read_datasource: {kind.__name__} must implement get_read_tasks(parallelism) "
                        "(or Ray's legacy prepare_read/create_reader)")
    return datasource.create_reader(**read_args)


def _estimate(reader) -> int | None:
    try:
        estimate = reader.estimate_inmemory_data_size()
    except NotImplementedError:
        return None
    return estimate if isinstance(estimate, int) and estimate >= 0 else None


def _no_blocks() -> Iterator[pa.Table]:
    yield from ()


def _read(task: ReadTask, name: str) -> Callable[[], Iterator[pa.Table]]:
    def read() -> Iterator[pa.Table]:
        left = task.per_task_row_limit
        produced = task()
        if not inspect.isgenerator(produced) and not hasattr(produced, "__iter__"):
            raise TypeError(f"{name}: a read task must return an iterable of blocks, got {type(produced).__name__}")
        for block in produced:
            table = from_udf_output(block, f"{name} read task")
            if left is not None:
                table = table.slice(0, left)
                left -= table.num_rows
            if table.num_rows:
                yield table
            if left is not None and left <= 0:
                return

    return read
