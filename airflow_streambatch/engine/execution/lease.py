"""The write lease: one writer at a time per output path.

Why: a write decides from what is committed (``resume`` skips it, ``overwrite``
deletes it, ``error`` and ``ignore`` look at it) and then commits partitions by
renaming into ``p<partition>``. Two writers on one path at once (two Airflow runs
of the same epoch, a Clear while the old try still runs) would both decide from the
same state: the second's renames collide with the first's, an overwrite deletes
the other's commits and staging. So every write takes ``<path>/_lease`` before it
looks at the path and gives it back when its run ends (`PartitionCommitter.cleanup`,
which runs on errors and SIGTERM too).

The lease is a small JSON file: host, pid, run id, since when, and the Airflow task
when there is one (``AIRFLOW_CTX_*``). On a local or POSIX shared filesystem it is
created atomically (written whole under a temporary name, then hard-linked to
``_lease``, which fails if it exists), so of two writers exactly one gets it. Other
filesystems (S3, GCS) have no exclusive create: there the lease is written and read
back, which catches writers that are not within the same instant (commits there are
not atomic either, `docs/reliability.md`).

A lease whose holder died on this host (SIGKILL, OOM) is taken over with a warning;
one held by a live process waits up to ``DataContext.write_lease_timeout_s`` and then
fails naming the holder. A holder on another host cannot be checked from here: the
error says so and how to remove the lease.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import json
import logging
import os
import threading
import time
import uuid
import weakref
from dataclasses import asdict, dataclass, field, fields

import pyarrow.fs as pafs

from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.filesystems import resolve
from airflow_streambatch.engine.worker.owner import left_by_dead_process, process_start, this_host

log = logging.getLogger("airflow_streambatch.engine.progress")

LEASE_FILE = "_lease"
POLL_S = 0.25  # how often a waiting writer looks again
_AIRFLOW_VARS = ("AIRFLOW_CTX_DAG_ID", "AIRFLOW_CTX_DAG_RUN_ID", "AIRFLOW_CTX_TASK_ID", "AIRFLOW_CTX_TRY_NUMBER")

_live: weakref.WeakValueDictionary[str, WriteLease] = weakref.WeakValueDictionary()  # token -> lease, this process
_pending: dict[str, WriteLease] = {}  # lease path -> taken by prepare_write, not yet claimed by the run
_lock = threading.Lock()


class WriteLeaseHeldError(StreamBatchError):
    """Another writer holds the output path's lease."""


@dataclass
class LeaseHolder:
    host: str
    pid: int
    run_id: str
    since: float = field(default_factory=time.time)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    airflow: str = ""  # dag/run/task/try of the Airflow task that writes, when there is one
    started: str = ""  # the holder process's start time (`owner.process_start`): tells a reused pid apart

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))
        who = f", Airflow task {self.airflow}" if self.airflow else ""
        return (f"host {self.host}, pid {self.pid}, run {self.run_id}{who}, since {since} "
                f"({time.time() - self.since:.0f} s ago)")


def _airflow_task() -> str:
    values = [os.environ.get(name, "") for name in _AIRFLOW_VARS]
    return "/".join(values) if values[0] else ""


class WriteLease:
    """This process's hold on one output path's lease; `release` gives it back (idempotent)."""

    def __init__(self, fs: pafs.FileSystem, path: str, holder: LeaseHolder):
        self.fs, self.path, self.holder = fs, path, holder
        self.released = False
        self.thread = threading.get_ident()
        _live[holder.token] = self

    def set_run_id(self, run_id: str) -> None:
        """Name the engine run that writes (prepare_write takes the lease before the run has an id)."""
        self.holder.run_id = run_id
        _write(self.fs, self.path, self.holder)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        _live.pop(self.holder.token, None)
        with _lock:
            if _pending.get(self.path) is self:
                del _pending[self.path]
        current = _read(self.fs, self.path)
        if current is not None and current.token == self.holder.token:
            with contextlib.suppress(FileNotFoundError):
                self.fs.delete_file(self.path)


def lease_path(root: str) -> str:
    return f"{root.rstrip('/')}/{LEASE_FILE}"


def acquire(path: str, run_id: str, timeout_s: float) -> WriteLease:
    """Take the lease of output ``path``, waiting at most ``timeout_s`` for a live holder.

    The lease is also parked for this process's next `claim` of the same path (the
    run's `PartitionCommitter.claim_staging`), which releases it at cleanup.
    """
    fs, root = resolve(path.rstrip("/"))
    target = lease_path(root)
    with _lock:  # this thread holds it already (an epoch run takes it before its write): keep holding it
        held = _pending.get(target)
    if held is not None and held.thread == threading.get_ident() and not held.released:
        return held
    fs.create_dir(root.rstrip("/"), recursive=True)
    deadline = time.monotonic() + timeout_s
    announced = False
    while True:
        holder = LeaseHolder(this_host(), os.getpid(), run_id, airflow=_airflow_task(),
                             started=process_start(os.getpid()))
        if _create(fs, target, holder):
            lease = WriteLease(fs, target, holder)
            with _lock:
                _pending[target] = lease
            return lease
        current = _read(fs, target)
        if current is None:  # released between our try and our look: try again, within the bound
            if time.monotonic() >= deadline + 5.0:
                raise WriteLeaseHeldError(f"could not create the write lease {target} of output path {path}: it "
                                          "keeps appearing and vanishing, or is not a file; remove it if it is "
                                          "not a lease")
            time.sleep(0.01)
            continue
        if _stale(current):
            _take_over(fs, root, target, current, path)
            continue
        if time.monotonic() >= deadline:
            raise WriteLeaseHeldError(_held_message(path, target, current, timeout_s))
        if not announced:
            log.warning("output %s is being written by %s; waiting up to %.0f s (DataContext.write_lease_timeout_s)",
                        path, current.describe(), timeout_s)
            announced = True
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


def claim(path: str) -> WriteLease | None:
    """The lease `acquire` parked for ``path`` in this process, now owned by the caller."""
    fs, root = resolve(path.rstrip("/"))
    with _lock:
        return _pending.pop(lease_path(root), None)


def check_not_held_by_another(path: str, doing: str) -> None:
    """Refuse ``doing`` (deleting output) while another live writer holds ``path``'s lease."""
    fs, root = resolve(path.rstrip("/"))
    current = _read(fs, lease_path(root))
    if current is None or current.token in _live or _stale(current):
        return
    raise WriteLeaseHeldError(f"cannot {doing} {path}: it is being written by {current.describe()}. "
                              + _remedy(lease_path(root), current))


def _held_message(path: str, target: str, holder: LeaseHolder, timeout_s: float) -> str:
    waited = f"after waiting {timeout_s:.0f} s" if timeout_s else "at once"
    return (f"output path {path} is being written by another run ({holder.describe()}); this write gave up "
            f"{waited}, so that no partition is committed twice or deleted under the other writer. "
            f"Set DataContext.write_lease_timeout_s (data_context={{'write_lease_timeout_s': 600}} on "
            "StreamBatchOperator) to wait for it, or write to another path (max_active_runs=1 keeps two runs "
            f"of one epoch apart). {_remedy(target, holder)}")


def _remedy(target: str, holder: LeaseHolder) -> str:
    if holder.host != this_host():
        return (f"The holder runs on host {holder.host}, which this host ({this_host()}) cannot check: if no "
                f"writer runs there any more, delete {target} by hand.")
    return f"Its lease is {target}; the next write takes it over once pid {holder.pid} has exited."


def _stale(holder: LeaseHolder) -> bool:
    """Left by a dead process of this host, or by this process for a lease object that no longer exists."""
    if left_by_dead_process(holder.host, holder.pid, holder.started):
        return True
    if holder.host == this_host() and holder.pid == os.getpid() and holder.token not in _live:
        gc.collect()  # a run whose executor failed to start: its lease object may wait in a cycle
        return holder.token not in _live
    return False


def _take_over(fs: pafs.FileSystem, root: str, target: str, stale: LeaseHolder, path: str) -> None:
    """Delete ``stale``'s lease, if it is still that one. Serialised among this host's processes by a
    lock on the output directory (only this host's writers break leases: only they can check the pid)."""
    with _directory_lock(fs, root):
        current = _read(fs, target)
        if current is None or current.token != stale.token:
            return
        log.warning("taking over the write lease of %s from a writer that died (%s); its staging is swept",
                    path, stale.describe())
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(target)


@contextlib.contextmanager
def _directory_lock(fs: pafs.FileSystem, root: str, bound_s: float = 30.0):
    if not isinstance(fs, pafs.LocalFileSystem):
        yield
        return
    fd = os.open(root, os.O_RDONLY)
    try:
        deadline = time.monotonic() + bound_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"could not lock {root} within {bound_s:.0f} s to take over its "
                                       "write lease") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _create(fs: pafs.FileSystem, target: str, holder: LeaseHolder) -> bool:
    """Create ``target`` holding ``holder``, unless it exists. Atomic on local filesystems."""
    if not isinstance(fs, pafs.LocalFileSystem):
        if fs.get_file_info(target).type != pafs.FileType.NotFound:
            return False
        _write(fs, target, holder)
        current = _read(fs, target)
        return current is not None and current.token == holder.token
    tmp = f"{target}.{holder.token[:8]}.tmp"
    with open(tmp, "w") as out:
        out.write(json.dumps(asdict(holder)))
    try:
        os.link(tmp, target)  # fails if the lease exists: the exclusive create, with the content already whole
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        try:  # a filesystem without hard links: exclusive create, then write
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(asdict(holder)))
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _write(fs: pafs.FileSystem, target: str, holder: LeaseHolder) -> None:
    """Write (or replace) ``target`` whole: a reader sees the old holder or the new one."""
    data = json.dumps(asdict(holder)).encode()
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = f"{target}.{uuid.uuid4().hex[:8]}.w"
        with open(tmp, "wb") as out:
            out.write(data)
        os.replace(tmp, target)
        return
    with fs.open_output_stream(target) as out:
        out.write(data)


def _read(fs: pafs.FileSystem, target: str) -> LeaseHolder | None:
    try:
        with fs.open_input_stream(target) as f:
            raw = f.read()
    except (FileNotFoundError, IsADirectoryError):
        return None
    except OSError as exc:  # pyarrow raises OSError for a missing object on some filesystems
        if fs.get_file_info(target).type == pafs.FileType.NotFound:
            return None
        raise exc
    try:
        data = json.loads(raw)
        return LeaseHolder(**{f.name: data[f.name] for f in fields(LeaseHolder) if f.name in data})
    except (ValueError, TypeError, AttributeError) as exc:
        raise WriteLeaseHeldError(f"{target} is not a write lease this engine can read ({exc}); if no writer "
                                  "uses this output path, delete it by hand") from exc
