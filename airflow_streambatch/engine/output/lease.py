"""The write lease: one writer at a time per output path.

Why: a write decides from what is committed (``resume`` skips it, ``overwrite``
deletes it, ``error`` and ``ignore`` look at it) and then commits partitions. Two
writers on one path at once (two Airflow runs of the same epoch, a Clear while the old
try still runs) would both decide from the same state: the second's commits collide
with the first's, an overwrite deletes the other's commits and staging. So every write
takes ``<path>/_lease`` (`target.OutputTarget.open`) before it looks at the path and
gives it back when it closes the target (on errors and SIGTERM too).

The lease is a small JSON object: host, pid, run id, since when, and the Airflow task
when there is one (``AIRFLOW_CTX_*``). It is created so that of two writers starting at
the same instant exactly one gets it:

* local and POSIX shared filesystems: written whole under a temporary name, then
  hard-linked to ``_lease`` (which fails if it exists). A lease whose holder died on
  this host (SIGKILL, OOM) is taken over with a warning; a holder on another host
  cannot be checked from here, and the error says how to remove its lease.
* object stores (S3, GCS, Azure): a conditional create (``If-None-Match: *``,
  `stores.create`). The holder renews it every third of ``DataContext.write_lease_ttl_s``
  with a conditional replace of the version it wrote; a lease not renewed in time (its
  holder died anywhere, or hangs) is taken over by a conditional replace of the
  version read, so of two writers taking over at once one wins. Release replaces it
  with a released mark the same way: nothing deletes a lease it did not write.
  A holder that could not renew stops committing (`WriteLease.check`).

One held by a live process waits up to ``DataContext.write_lease_timeout_s`` and then
fails naming the holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, fields

import pyarrow.fs as pafs

from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.filesystems import object_store_scheme
from airflow_streambatch.engine.output import stores
from airflow_streambatch.engine.worker.owner import left_by_dead_process, process_start, this_host

log = logging.getLogger("airflow_streambatch.engine.progress")

LEASE_FILE = "_lease"
POLL_S = 0.25  # how often a waiting writer looks again
_AIRFLOW_VARS = ("AIRFLOW_CTX_DAG_ID", "AIRFLOW_CTX_DAG_RUN_ID", "AIRFLOW_CTX_TASK_ID", "AIRFLOW_CTX_TRY_NUMBER")


class WriteLeaseHeldError(StreamBatchError):
    """Another writer holds the output path's lease."""


class WriteLeaseLostError(StreamBatchError):
    """This writer's lease expired or was taken over: it must not commit any more."""


@dataclass
class LeaseHolder:
    host: str
    pid: int
    run_id: str
    since: float = field(default_factory=time.time)
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    airflow: str = ""  # dag/run/task/try of the Airflow task that writes, when there is one
    started: str = ""  # the holder process's start time (`owner.process_start`): tells a reused pid apart
    expires_at: float = 0.0  # object stores: taken over after this (holder's clock); 0: never expires
    released: bool = False  # object stores: given back (the object stays, marked free)

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(self.since))
        who = f", Airflow task {self.airflow}" if self.airflow else ""
        return (f"host {self.host}, pid {self.pid}, run {self.run_id}{who}, since {since} "
                f"({time.time() - self.since:.0f} s ago)")

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()


def _airflow_task() -> str:
    values = [os.environ.get(name, "") for name in _AIRFLOW_VARS]
    return "/".join(values) if values[0] else ""


class WriteLease:
    """This process's hold on one output path's lease; `release` gives it back (idempotent)."""

    def __init__(self, fs: pafs.FileSystem, path: str, holder: LeaseHolder, e_tag: str = "", ttl_s: float = 0.0):
        self.fs, self.path, self.holder = fs, path, holder
        self.e_tag, self.ttl_s = e_tag, ttl_s
        self.released = False
        self.lost = ""  # why this holder may no longer commit
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if e_tag:
            threading.Thread(target=self._renew_loop, name=f"lease-{path}", daemon=True).start()

    def set_run_id(self, run_id: str) -> None:
        """Name the engine run that writes (the lease is taken before the run has an id)."""
        with self._lock:
            self.holder.run_id = run_id
            if self.e_tag:
                self._renew_now()
            elif isinstance(self.fs, pafs.LocalFileSystem):
                _write_local(self.path, self.holder)
            else:
                with self.fs.open_output_stream(self.path) as out:
                    out.write(self.holder.encode())

    def check(self) -> None:
        """Raise `WriteLeaseLostError` unless this writer still holds the lease: before each commit."""
        if self.e_tag and not self.lost and time.time() >= self.holder.expires_at:
            self.lost = f"it expired at {time.ctime(self.holder.expires_at)} before it could be renewed"
        if self.lost:
            raise WriteLeaseLostError(f"the write lease {self.path} is no longer this run's ({self.lost}); nothing "
                                      "more is committed by it. Another writer may hold it: rerun with "
                                      "mode='resume' once it is done (raise DataContext.write_lease_ttl_s if the "
                                      "store answers slowly)")

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._stop.set()
        with self._lock:
            if self.e_tag:
                if not self.lost:
                    with contextlib.suppress(stores.PreconditionFailed):
                        self.holder.released = True
                        stores.replace(self.fs, self.path, self.holder.encode(), self.e_tag)
                return
            current = _read(self.fs, self.path)
            if current is not None and current.token == self.holder.token:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.delete_file(self.path)

    def _renew_now(self) -> None:
        self.holder.expires_at = time.time() + self.ttl_s
        try:
            self.e_tag = stores.replace(self.fs, self.path, self.holder.encode(), self.e_tag)
        except stores.PreconditionFailed:
            self.lost = "another writer replaced it"
            log.error("the write lease %s was taken over by another writer; this run commits nothing more",
                      self.path)

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            with self._lock:
                if self.released or self.lost:
                    return
                try:
                    self._renew_now()
                except Exception as exc:  # noqa: BLE001 - the store did not answer: try again; `check` says
                    log.warning("could not renew the write lease %s (%s); retrying", self.path, exc)  # when too late


def lease_path(root: str) -> str:
    return f"{root.rstrip('/')}/{LEASE_FILE}"


def acquire(fs: pafs.FileSystem, root: str, run_id: str, timeout_s: float, ttl_s: float) -> WriteLease:
    """Take the lease of the output directory ``root`` of ``fs``, waiting at most ``timeout_s``
    for a live holder."""
    target = lease_path(root)
    on_store = object_store_scheme(fs) is not None
    if not on_store:
        fs.create_dir(root.rstrip("/"), recursive=True)
    deadline = time.monotonic() + timeout_s
    announced = False
    while True:
        holder = LeaseHolder(this_host(), os.getpid(), run_id, airflow=_airflow_task(),
                             started=process_start(os.getpid()))
        lease = _try_store(fs, target, holder, ttl_s) if on_store else _try_local(fs, target, holder)
        if lease is not None:
            return lease
        current = _read(fs, target)
        if current is None:  # released between our try and our look: try again, within the bound
            if time.monotonic() >= deadline + 5.0:
                raise WriteLeaseHeldError(f"could not create the write lease {target}: it keeps appearing and "
                                          "vanishing, or is not a file; remove it if it is not a lease")
            time.sleep(0.01)
            continue
        if _stale(current) and not on_store:
            _take_over_local(fs, root, target, current)
            continue
        if time.monotonic() >= deadline:
            raise WriteLeaseHeldError(_held_message(root, target, current, timeout_s))
        if not announced:
            log.warning("output %s is being written by %s; waiting up to %.0f s (DataContext.write_lease_timeout_s)",
                        root, current.describe(), timeout_s)
            announced = True
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))


def check_not_held_by_another(fs: pafs.FileSystem, root: str, doing: str, own: WriteLease | None) -> None:
    """Refuse ``doing`` (deleting output) while another live writer holds ``root``'s lease."""
    current = _read(fs, lease_path(root))
    if current is None or current.released or _stale(current):
        return
    if own is not None and current.token == own.holder.token:
        return
    raise WriteLeaseHeldError(f"cannot {doing} {root}: it is being written by {current.describe()}. "
                              + _remedy(lease_path(root), current))


def _try_store(fs: pafs.FileSystem, target: str, holder: LeaseHolder, ttl_s: float) -> WriteLease | None:
    """Create the lease, or take over a released or expired one; None if a live writer holds it."""
    holder.expires_at = time.time() + ttl_s
    try:
        return WriteLease(fs, target, holder, stores.create(fs, target, holder.encode()), ttl_s)
    except stores.PreconditionFailed:
        pass
    current = stores.read(fs, target)
    if current is None:
        return None
    held = _decode(target, current.data)
    if not (held.released or _stale(held)):
        return None
    if not held.released:
        log.warning("taking over the write lease of %s from a writer that stopped renewing it (%s)", target,
                    held.describe())
    try:
        return WriteLease(fs, target, holder, stores.replace(fs, target, holder.encode(), current.e_tag), ttl_s)
    except stores.PreconditionFailed:
        return None  # another writer took it over first


def _held_message(root: str, target: str, holder: LeaseHolder, timeout_s: float) -> str:
    waited = f"after waiting {timeout_s:.0f} s" if timeout_s else "at once"
    return (f"output path {root} is being written by another run ({holder.describe()}); this write gave up "
            f"{waited}, so that no partition is committed twice or deleted under the other writer. "
            f"Set DataContext.write_lease_timeout_s (data_context={{'write_lease_timeout_s': 600}} on "
            "StreamBatchOperator) to wait for it, or write to another path (max_active_runs=1 keeps two runs "
            f"of one epoch apart). {_remedy(target, holder)}")


def _remedy(target: str, holder: LeaseHolder) -> str:
    if holder.expires_at:
        return (f"Its lease {target} expires at {time.ctime(holder.expires_at)} unless renewed; the next write "
                "takes it over then.")
    if holder.host != this_host():
        return (f"The holder runs on host {holder.host}, which this host ({this_host()}) cannot check: if no "
                f"writer runs there any more, delete {target} by hand.")
    return f"Its lease is {target}; the next write takes it over once pid {holder.pid} has exited."


def _stale(holder: LeaseHolder) -> bool:
    """Left by a dead process of this host, or (object stores) not renewed in time."""
    if holder.expires_at and time.time() > holder.expires_at:
        return True
    return left_by_dead_process(holder.host, holder.pid, holder.started)


def _take_over_local(fs: pafs.FileSystem, root: str, target: str, stale: LeaseHolder) -> None:
    """Delete ``stale``'s lease, if it is still that one. Serialised among this host's processes by a
    lock on the output directory (only this host's writers break leases: only they can check the pid)."""
    with _directory_lock(fs, root):
        current = _read(fs, target)
        if current is None or current.token != stale.token:
            return
        log.warning("taking over the write lease of %s from a writer that died (%s); its staging is swept",
                    root, stale.describe())
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


def _try_local(fs: pafs.FileSystem, target: str, holder: LeaseHolder) -> WriteLease | None:
    """Create ``target`` holding ``holder`` unless it exists: atomic on local and POSIX filesystems;
    elsewhere (HDFS) written and read back, which catches writers that are not within the same instant."""
    if not isinstance(fs, pafs.LocalFileSystem):
        if fs.get_file_info(target).type != pafs.FileType.NotFound:
            return None
        with fs.open_output_stream(target) as out:
            out.write(holder.encode())
        current = _read(fs, target)
        return WriteLease(fs, target, holder) if current is not None and current.token == holder.token else None
    tmp = f"{target}.{holder.token[:8]}.tmp"
    with open(tmp, "wb") as out:
        out.write(holder.encode())
    try:
        os.link(tmp, target)  # fails if the lease exists: the exclusive create, with the content already whole
        return WriteLease(fs, target, holder)
    except FileExistsError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        try:  # a filesystem without hard links: exclusive create, then write
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(fd, "wb") as out:
            out.write(holder.encode())
        return WriteLease(fs, target, holder)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _write_local(target: str, holder: LeaseHolder) -> None:
    """Replace the local lease ``target`` whole: a reader sees the old holder or the new one."""
    tmp = f"{target}.{uuid.uuid4().hex[:8]}.w"
    with open(tmp, "wb") as out:
        out.write(holder.encode())
    os.replace(tmp, target)


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
    return _decode(target, raw)


def _decode(target: str, raw: bytes) -> LeaseHolder:
    try:
        data = json.loads(raw)
        return LeaseHolder(**{f.name: data[f.name] for f in fields(LeaseHolder) if f.name in data})
    except (ValueError, TypeError, AttributeError) as exc:
        raise WriteLeaseHeldError(f"{target} is not a write lease this engine can read ({exc}); if no writer "
                                  "uses this output path, delete it by hand") from exc
