"""`DataContext`: the one configuration object of the engine.

Every knob the planner, scheduler and Spark backend read lives here, with its
default declared (and explained) beside it, so there is exactly one place to look.
Values are checked when they are set, and errors name the setting to change.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.execution_resources import ExecutionOptions
from airflow_streambatch.engine.filesystems import free_bytes
from airflow_streambatch.engine.network_settings import NETWORK_SETTINGS, validate_network_setting

MiB = 1024 * 1024

POLICIES = ("adaptive", "conservative")
ROW_ERROR_POLICIES = ("fail", "quarantine")  # `worker/row_errors.py`


def _default_memory_limit() -> int:
    """A quarter of physical memory: blocks live in tmpfs here, which is memory."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4)
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 4 * 1024 * MiB


def _default_block_dir() -> str:
    """``$STREAMBATCH_BLOCK_DIR`` (a cluster's shared directory, as docker-compose.yaml sets it),
    else tmpfs where there is one with room for the default ``memory_limit`` (a 128 MiB block
    costs 0.25 s there), else the temp dir: a default never fails `block_room`'s check at start.

    The default is per user (``streambatch-<uid>``): a directory every local user shares
    lets any of them pre-create it and swap or read the blocks of another's runs. The
    engine creates it 0700 and refuses it when someone else owns it or may write in it
    (`blocks.check_block_dir`)."""
    if os.environ.get("STREAMBATCH_BLOCK_DIR"):
        return os.environ["STREAMBATCH_BLOCK_DIR"]
    shm = "/dev/shm"
    roomy = os.path.isdir(shm) and os.access(shm, os.W_OK) and free_bytes(shm) >= _default_memory_limit()
    base = shm if roomy else tempfile.gettempdir()  # a container's 64 MiB /dev/shm cannot hold the default limit
    return os.path.join(base, f"streambatch-{os.geteuid()}")


@dataclass
class DataContext:
    """Execution settings of the streaming batch engine.

    :param target_max_block_size: bytes at which a task cuts an output block
        (streaming repartition). Default 128 MiB, as in the paper.
    :param target_min_block_size: a task takes several input blocks only while they are
        smaller than this together and cheap to process: their expected work under one
        Spark job's overhead and their output under ``target_max_block_size`` (task sizing
        by cost, ``execution/operators/map.py``). Default 1 MiB; 1 runs one block per task.
    :param memory_limit: bytes of intermediate blocks the scheduler keeps in flight.
        A running task writes blocks beyond its reservation only when the scheduler
        grants the memory (streaming task output). Default: a quarter of physical memory.
    :param scheduling_policy: ``"adaptive"`` (Algorithms 1 and 2 of the paper: may
        briefly overshoot, keeps slots busy) or ``"conservative"`` (launches a task
        only when its estimated output fits: stays under ``memory_limit``).
    :param resources: execution slots, e.g. ``{"CPU": 8, "GPU": 2, "tpu": 1}``.
        ``None`` reads them from Spark: task slots for CPU; for GPUs, the addresses the
        executors own, or under dynamic allocation the standalone workers' GPUs
        (``docs/cluster-gpus.md``); in local mode the machine's (``CUDA_VISIBLE_DEVICES``,
        else ``nvidia-smi``: ``spark/local_gpus.py``).
    :param block_dir: where each host keeps the blocks (Arrow IPC files) its tasks write;
        one sub-directory per run. Private to the host by default (tmpfs, else the temp
        dir, per user): blocks reach other hosts through the host's agent
        (``worker/host_agent.py``); a directory every host shares works too. It must be
        owned by the user running Spark and not writable by group or others.
    :param group_scheduling: launch ready tasks of one operator as one Spark job
        (Drizzle), each Spark partition running a group of tasks in turn and then checking
        in with the driver for the next (``execution/check_ins.py``), so a job runs while
        there is work for its slots. `GroupSizer` (``engine/spark/group_sizer.py``) picks
        a group's depth from the measured cost of a check-in:
        ``ceil(check-in overhead / (scheduling_overhead_bound * task time))``, at most
        ``max_group_size`` and no more than the ready tasks per slot. Off: one task per
        partition, and each job ends with its tasks.
    :param scheduling_overhead_bound: the share of a task's work that scheduling (a
        check-in) may cost it; a lower bound packs more tasks into one group. Default 0.1.
    :param max_group_size: most tasks one Spark partition may run in turn (the depth
        cap of group scheduling). Default 64.
    :param budget_update_interval_s: how often Algorithm 2 replenishes the source
        budget. Default 0.05 s: the paper's 1 s left the slots idle for most of each
        second when tasks take milliseconds (16 read tasks of 4 MiB under a 10 MiB limit
        took 6.1 s where 0.5 s will do); the rate it refills at does not depend on it.
    :param progress_interval_s: seconds between progress lines on the
        ``airflow_streambatch.engine.progress`` logger; 0 disables them.
    :param enable_operator_fusion: fuse adjacent operators with equal resource
        requests. Off only to study unfused pipelines (benchmark W3).
    :param max_task_retries: times a task whose user code raised is run again
        before its input partition is marked failed. Default 2.
    :param max_failed_partitions: input partitions allowed to fail before the whole
        run fails; the others still finish and commit. Default 0.
    :param on_row_error: what a write does with a row its functions raise on, unless a
        ``map``/``map_batches``/``flat_map``/``filter`` says otherwise (``on_error=``):
        ``"fail"`` (default) fails the task, then the partition; ``"quarantine"`` sets the
        row aside, with its error, in ``_quarantine-*.parquet`` files committed beside the
        partition's data (`worker/row_errors.py`).
    :param task_timeout_s: seconds one task may run before its Spark job is cancelled
        (its Python worker killed) and the task retried like any failure; ``None``
        (default) waits as long as the task runs, as Spark does. Set it where a UDF can
        hang (a stuck network call, a deadlocked library).
    :param stall_timeout_s: seconds tasks may wait for memory grants while nothing
        moves (no block written, no task finished, no grant) before the run fails with
        an error that says what each waiting task waits for. Default 300.
    :param write_lease_timeout_s: seconds a write waits while another live run writes the
        same output path (holds its ``_lease``) before failing with an error naming that run.
        Default 0: refuse at once, so a second Airflow run of the same epoch fails fast and
        its retry (or a later Clear) resumes what the first committed, instead of holding
        a worker slot while it waits. A lease left by a dead run on this host is taken over.
    :param write_lease_ttl_s: on object stores (S3, GCS, Azure), how long a write lease
        lasts unless its holder renews it (every third of this); a lease past it is
        taken over by the next writer, so a driver killed on another host blocks the path
        for at most this long. Default 60. A holder that could not renew in time stops
        committing (another writer may have taken over).
    :param table_commit_interval_s: a write to a Delta or Iceberg table commits the
        partitions that are done in one table transaction at most this often (and when
        the run ends): one transaction per partition would flood the table's log.
        Default 10.
    :param control_timeout_s: seconds a task keeps trying to reach the driver's control plane
        (to announce a block or ask for memory) or another host's block server, before it
        fails with an error naming the address. Default 60.
    :param build_ahead: a Spark partition starts building the instances of its CPU operator's
        classes, and of later CPU operators' classes whose ``concurrency`` cap is at least the
        CPU task slots (under a free slot of the cap), in a thread of its Python worker as it
        starts, so a model loads while the input is read. Default False: on W4 here (2 cores,
        a CPU model, local files) the build competed with the reads for the cores and saved
        nothing (docs/benchmarks.md); it pays where reads wait on I/O.
    :param control_ports: the port(s) the driver's control plane listens on: ``None`` (default,
        any free port), a port such as ``41000`` or a range such as ``"41000-41009"`` (a busy
        port is skipped). Taken once per driver process (docs/network.md).
    :param agent_ports: the same for the block server of each host's agent.
    :param tls: encrypt the control plane and the host agents (default True): the driver
        makes a certificate authority per process and certificates for itself and each agent.
    :param tls_cert_file: PEM certificate the driver's control plane presents instead of a
        generated one (with ``tls_key_file``; ``tls_ca_file``: the CA that signed it, when
        the certificate is not self-signed). Agents keep certificates from the generated CA.
    :param tls_key_file: the private key of ``tls_cert_file`` (PEM).
    :param tls_ca_file: PEM of the authority that signed ``tls_cert_file``; executors trust it.
    :param execution_options: Ray Data's `ExecutionOptions` (``preserve_order``, ``resource_limits``).
    :param use_arrow_tensor_v2: Ray's choice between its two Arrow tensor types (V1: int32 offsets,
        2 GiB per column chunk; V2: int64). Default True, as in Ray. The engine has one tensor
        representation, nested fixed-size lists (`worker/tensors.py`), with no 2 GiB limit, and
        ``ArrowTensorTypeV2`` is ``ArrowTensorType``: either value is accepted and changes nothing.
    :param use_streaming_executor: Ray's switch between its streaming and its older bulk executor.
        Default True, as in Ray. The engine's executor is always streaming; False is refused,
        since no bulk executor exists here to switch to.
    :param actor_prefetcher_enabled: Ray's choice of prefetching blocks for ``iter_batches``
        through an actor (True) or ``ray.wait`` (False). Default False, as in Ray. There are no
        actors here: the executor itself runs ahead of the consumer under ``memory_limit``
        (`iteration.py`), so either value is accepted and changes nothing.
    :param decoding_size_estimation: Ray's estimate of a file read's in-memory size from a
        sample of decoded rows (its Parquet ``encoding ratio``). Default True, as in Ray. Here a
        Parquet read task is sized from the uncompressed sizes in its row groups' footers
        (`parquet_ranges.py`), without sampling; either value is accepted and changes nothing.
    """

    target_max_block_size: int = 128 * MiB
    target_min_block_size: int = 1 * MiB
    memory_limit: int = field(default_factory=_default_memory_limit)
    scheduling_policy: str = "adaptive"
    resources: dict[str, float] | None = None
    block_dir: str = field(default_factory=_default_block_dir)
    group_scheduling: bool = True
    scheduling_overhead_bound: float = 0.1
    max_group_size: int = 64
    budget_update_interval_s: float = 0.05
    progress_interval_s: float = 5.0
    enable_operator_fusion: bool = True
    max_task_retries: int = 2
    max_failed_partitions: int = 0
    on_row_error: str = "fail"
    task_timeout_s: float | None = None
    stall_timeout_s: float = 300.0
    write_lease_timeout_s: float = 0.0
    write_lease_ttl_s: float = 60.0
    table_commit_interval_s: float = 10.0
    control_timeout_s: float = 60.0
    build_ahead: bool = False
    control_ports: int | str | None = None
    agent_ports: int | str | None = None
    tls: bool = True
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None
    execution_options: ExecutionOptions = field(default_factory=ExecutionOptions)
    use_arrow_tensor_v2: bool = True
    use_streaming_executor: bool = True
    actor_prefetcher_enabled: bool = False
    decoding_size_estimation: bool = True

    _global: ClassVar[DataContext | None] = None

    def __setattr__(self, name: str, value) -> None:
        _validate(name, value)
        super().__setattr__(name, value)

    @classmethod
    def get_current(cls) -> DataContext:
        """The process-wide context (created with defaults on first use)."""
        if cls._global is None:
            cls._global = cls()
        return cls._global

    @contextlib.contextmanager
    def scoped(self, **overrides) -> Iterator[DataContext]:
        """Make this context (or, with ``overrides``, a copy of it that has them) the current
        one for a ``with`` block; the previous current context is restored when the block
        ends, by an exception too. Yields the context that is current inside the block::

            with DataContext.get_current().scoped(memory_limit=2 << 30) as ctx:
                ds.write_parquet(path)  # runs with ctx
        """
        ctx = self.copy(**overrides) if overrides else self
        previous = DataContext._global
        DataContext._global = ctx
        try:
            yield ctx
        finally:
            DataContext._global = previous

    @classmethod
    def check_settings(cls, settings: Any, *, argument: str | None = "data_context", skip_templated: bool = False,
                       parse_strings: bool = False) -> dict:
        """Check a dict of settings (`StreamBatchOperator`'s ``data_context``, ``copy``'s and ``scoped``'s
        keywords) and return it: the one place that does, so the DAG parser, the task and the engine
        give the same errors. Each error names ``argument`` (``None``: the settings are keywords of
        ``DataContext``), the key and the fix: an unknown key with the closest setting names (a typo
        such as ``memory_limt`` would otherwise be ignored or fail as an unexpected keyword), a value
        with what the setting takes.

        ``skip_templated``: when the DAG is parsed, a value holding a Jinja template (``"{{"``) is not
        known yet; it is left for ``execute``. ``parse_strings``: after rendering without
        ``render_template_as_native_obj`` a template's value is a string (``"2147483648"``,
        ``"True"``, ``"{'GPU': 1}"``): read it as a Python or JSON literal for settings that are not
        strings; ``settings`` itself may be such a string.
        """
        if parse_strings and isinstance(settings, str):
            settings = _literal(settings)
        if not isinstance(settings, Mapping):
            raise ValueError(f"{argument or 'DataContext settings'} must be a dict of DataContext settings, e.g. "
                             f"{{'memory_limit': 2 << 30}}, got {type(settings).__name__} {settings!r}")
        names = [f.name for f in fields(cls)]
        checked = {}
        for key, value in settings.items():
            if key not in names:
                where = f"{argument} has an unknown key" if argument else "DataContext has no setting"
                raise ValueError(f"{where} {key!r}.{_did_you_mean(key, names)} The settings are: {', '.join(names)} "
                                 "(each explained in airflow_streambatch/engine/context.py)")
            if skip_templated and is_templated(value):
                checked[key] = value
                continue
            if parse_strings and isinstance(value, str) and key not in _STRING_SETTINGS:
                value = _literal(value)
            try:
                _validate(key, _as_setting(key, value))
            except ValueError as exc:
                message, setting = str(exc), f"DataContext.{key}"
                if argument and message.startswith(setting):  # "data_context['memory_limit'] must be ..."
                    message = f"{argument}[{key!r}]{message[len(setting):]}"
                raise ValueError(message) from None
            checked[key] = value
        return checked

    def copy(self, **changes) -> DataContext:
        """A copy with ``changes``: checked by `check_settings` (a misspelt name fails with a suggestion, not
        as an unexpected keyword), ``execution_options`` also as a dict such as ``{"preserve_order": True}``."""
        changes = {name: _as_setting(name, value) for name, value in
                   self.check_settings(changes, argument=None).items()}
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        if values["resources"] is not None:
            values["resources"] = dict(values["resources"])
        options = values["execution_options"]
        values["execution_options"] = replace(options, resource_limits=options.resource_limits.copy())
        return DataContext(**values)


_POSITIVE_INTS = ("target_max_block_size", "target_min_block_size", "memory_limit", "max_group_size")
_POSITIVE_FLOATS = ("scheduling_overhead_bound", "budget_update_interval_s", "stall_timeout_s",
                    "control_timeout_s", "write_lease_ttl_s")
_NON_NEGATIVE_FLOATS = ("write_lease_timeout_s", "table_commit_interval_s")
_BOOLS = ("group_scheduling", "enable_operator_fusion", "build_ahead", "use_arrow_tensor_v2",
          "actor_prefetcher_enabled", "decoding_size_estimation", "use_streaming_executor")


def _validate(name: str, value) -> None:
    if name in NETWORK_SETTINGS:
        validate_network_setting(name, value)
    elif name in _POSITIVE_INTS:
        check_positive_int(value, f"DataContext.{name}")
    elif name in _POSITIVE_FLOATS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"DataContext.{name} must be a positive number, got {value!r}")
    elif name in ("max_task_retries", "max_failed_partitions"):
        check_positive_int(value, f"DataContext.{name}", allow_zero=True)
    elif name == "task_timeout_s" and value is not None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"DataContext.task_timeout_s must be a positive number of seconds or None, got {value!r}")
    elif name in _NON_NEGATIVE_FLOATS:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"DataContext.{name} must be a number of seconds >= 0, got {value!r}")
    elif name == "progress_interval_s":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"DataContext.progress_interval_s must be >= 0, got {value!r}")
    elif name == "scheduling_policy":
        if value not in POLICIES:
            raise ValueError(f"DataContext.scheduling_policy must be one of {POLICIES}, got {value!r}."
                             f"{_did_you_mean(value, POLICIES) if isinstance(value, str) else ''}")
    elif name == "on_row_error":
        if value not in ROW_ERROR_POLICIES:
            raise ValueError(f"DataContext.on_row_error must be one of {ROW_ERROR_POLICIES}, got {value!r}."
                             f"{_did_you_mean(value, ROW_ERROR_POLICIES) if isinstance(value, str) else ''}")
    elif name in _BOOLS and not isinstance(value, bool):
        raise ValueError(f"DataContext.{name} must be True or False, got {value!r}")
    elif name == "use_streaming_executor" and value is not True:
        raise ValueError("DataContext.use_streaming_executor must be True: the engine's executor is always "
                         "streaming, and Ray's bulk executor (False) does not exist here")
    elif name == "block_dir" and (not isinstance(value, (str, os.PathLike)) or not str(value)):
        raise ValueError(f"DataContext.block_dir must be a directory path, got {value!r}")
    elif name == "execution_options" and not isinstance(value, ExecutionOptions):
        raise ValueError(f"DataContext.execution_options must be an ExecutionOptions, got {value!r}")
    elif name == "resources" and value is not None:
        if not isinstance(value, dict):
            raise ValueError(f"DataContext.resources must be a dict such as {{'CPU': 4, 'GPU': 1}}, got {value!r}")
        for key, amount in value.items():
            if not isinstance(key, str) or not key:
                raise ValueError(f"DataContext.resources keys must be resource names such as 'CPU' or 'GPU', "
                                 f"got {key!r}")
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
                raise ValueError(f"DataContext.resources[{key!r}] must be a number >= 0, got {amount!r}")


# a rendered template's string is the value itself
_STRING_SETTINGS = ("scheduling_policy", "block_dir", "on_row_error")


def is_templated(value) -> bool:
    """Whether ``value`` holds a Jinja template (in a string, or inside a dict or list): Airflow renders
    it only when the task runs, so it cannot be checked when the DAG is parsed."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, Mapping):
        return any(is_templated(k) or is_templated(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(is_templated(v) for v in value)
    return False


def _literal(text: str):
    """A rendered template's text as the value it spells (Python or JSON literal); the text itself if neither."""
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(text)
    except ValueError:
        return text


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=2)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _as_setting(name: str, value):
    """``execution_options`` given as a dict (JSON: a DAG's ``data_context``) becomes an `ExecutionOptions`."""
    if name != "execution_options" or not isinstance(value, Mapping):
        return value
    names = [f.name for f in fields(ExecutionOptions)]
    for key in value:
        if key not in names:
            raise ValueError(f"DataContext.execution_options has no setting {key!r}.{_did_you_mean(key, names)} "
                             f"It has: {', '.join(names)}")
    return ExecutionOptions(**value)
