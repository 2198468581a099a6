"""A Spark standalone cluster whose workers and drivers look like separate hosts.

Tests of host-local state (shared-memory segments, spill files, per-host helper daemons)
mean nothing on one machine where every process sees the same ``/dev/shm`` and ``/tmp``.
Here each worker and each driver runs in its own mount namespace (``unshare --mount``,
private propagation) with fresh tmpfs mounts on ``/dev/shm`` and ``/tmp``: what one "host"
writes there the others cannot see. Executors, Python workers and anything they spawn,
detached or not, inherit the namespace, so a host is "every process in that namespace":
``kill_host`` and ``stop`` kill by namespace, not only by process group. The network is
shared (127.0.0.1). Logs, worker work dirs and test data live in a shared directory under
``/var/tmp`` (pytest's ``tmp_path`` is under ``/tmp``, which the hosts do not see).

Needs root, ``unshare`` and ``nsenter`` (util-linux); ``namespaces_unsupported()`` says why not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import pyspark

from standalone_cluster import StandaloneCluster

PRIVATE_ROOTS = ("/dev/shm", "/tmp")
# The checkout and its interpreter stay visible when they live under a private root (a CI clone in
# /tmp): each is opened (fd 3, 4, ...) before the tmpfs hides it, then bound back from that fd (not
# canonicalized: mount would resolve the fd back to the path, which by then names the empty tmpfs).
_KEEP = sorted({p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), sys.prefix)
                if p.startswith(tuple(r + "/" for r in PRIVATE_ROOTS))})
_KEEP = [p for p in _KEEP if not any(p.startswith(q + "/") for q in _KEEP)]  # a parent's bind covers it
_OPEN_KEPT = "".join(f'exec {3 + i}<"{p}" || exit 96; ' for i, p in enumerate(_KEEP))
_BIND_KEPT = "".join(f'mkdir -p "{p}" && mount --no-canonicalize --bind /proc/self/fd/{3 + i} "{p}" '
                     f'&& exec {3 + i}<&- || exit 96; ' for i, p in enumerate(_KEEP))
# Runs as root inside the new namespace: fresh tmpfs on every private root, then the real command.
_MOUNT_AND_EXEC = (f"{_OPEN_KEPT}for d in {' '.join(PRIVATE_ROOTS)}; do "
                   'mount -t tmpfs -o mode=1777,size=4g,nosuid,nodev streambatch-host "$d" || exit 97; done; '
                   f'{_BIND_KEPT}exec "$@"')
HOST_WRAPPER = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT_AND_EXEC, "host"]


def mount_namespace(pid: int | str = "self") -> str | None:
    """``mnt:[inode]`` of a live process; None once it is gone (or a zombie)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def namespace_pids(namespace: str) -> list[int]:
    """Every live process in a mount namespace, detached ones (setsid) included."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and mount_namespace(entry) == namespace]


def kill_namespace(namespace: str, timeout: float = 30) -> None:
    """SIGKILL every process in the namespace until none is left (a dying parent may still fork)."""
    deadline = time.time() + timeout
    while pids := namespace_pids(namespace):
        if time.time() > deadline:
            raise RuntimeError(f"processes {pids} of {namespace} survive SIGKILL")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def namespaces_unsupported() -> str | None:
    """Why private-mount hosts cannot be simulated here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to mount tmpfs in a private mount namespace"
    missing = [tool for tool in ("unshare", "nsenter", "mount") if shutil.which(tool) is None]
    if missing:
        return f"needs util-linux tools {missing}"
    probe = subprocess.run([*HOST_WRAPPER, "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare --mount failed: {probe.stderr.strip()}"


@dataclass
class Host:
    """One simulated machine: the process that created the namespace and a handle on the namespace.

    The open ``ns_fd`` keeps the namespace (and its tmpfs contents) alive after its last process
    exits and stops the kernel from reusing its inode number, so ``namespace`` stays unambiguous."""

    name: str
    proc: subprocess.Popen
    namespace: str
    ns_fd: int

    def pids(self) -> list[int]:
        return namespace_pids(self.namespace)

    def files(self, roots: tuple[str, ...] = PRIVATE_ROOTS) -> list[str]:
        """Every file and directory under ``roots`` as this host sees them (absolute paths), but
        not the checkout bound back into them (``_KEEP``)."""
        if self.ns_fd < 0:
            raise RuntimeError(f"{self.name} was released; its namespace is gone")
        prune = [arg for path in _KEEP for arg in ("-path", path, "-prune", "-o")]
        out = subprocess.run(["nsenter", f"--mount=/proc/self/fd/{self.ns_fd}", "find", *roots, "-mindepth", "1",
                              *prune, "-print0"], pass_fds=(self.ns_fd,), capture_output=True, text=True, timeout=60)
        if out.returncode != 0 and "nsenter:" in out.stderr:
            raise RuntimeError(f"cannot enter {self.name}: {out.stderr.strip()}")
        return sorted(path for path in out.stdout.split("\0") if path)  # find fails on files deleted meanwhile

    def kill(self) -> None:
        kill_namespace(self.namespace)
        self.proc.wait(timeout=30)

    def release(self) -> None:
        """Kill the host and drop the namespace handle: the namespace and its mounts vanish."""
        self.kill()
        if self.ns_fd >= 0:
            os.close(self.ns_fd)
            self.ns_fd = -1


def _enter(name: str, proc: subprocess.Popen, timeout: float = 30) -> Host:
    """Wait until the new process has left our namespace (unshare ran), then hold on to its namespace."""
    ours, deadline = mount_namespace(), time.time() + timeout
    while time.time() < deadline:
        namespace = mount_namespace(proc.pid)
        if namespace is not None and namespace != ours:
            fd = os.open(f"/proc/{proc.pid}/ns/mnt", os.O_RDONLY)
            if mount_namespace(proc.pid) == namespace:  # still the same process and namespace
                return Host(name, proc, namespace, fd)
            os.close(fd)
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before entering its namespace")
        time.sleep(0.01)
    raise RuntimeError(f"{name} did not unshare its mount namespace in {timeout}s")


def host_env(base: dict | None = None) -> dict:
    """An environment for a process in a private host: no temp dir setting pointing into our /tmp."""
    env = dict(os.environ if base is None else base)
    for key in ("TMPDIR", "TEMP", "TMP"):
        if env.get(key, "").startswith(PRIVATE_ROOTS):
            del env[key]
    return env


class NamespacedCluster(StandaloneCluster):
    """Master in our namespace; each worker, and each driver started by ``run_driver``, a private host."""

    def __init__(self, work_dir: str | None = None, workers: int = 2, cores: int = 1, memory: str = "1g",
                 worker_conf: dict[int, dict[str, str]] | None = None):
        """``work_dir`` (logs, worker work dirs) must be visible to every host: not under /tmp or /dev/shm.
        Left out, a fresh 0700 dir under /var/tmp is made and removed by ``stop()``."""
        if work_dir is not None and os.path.realpath(work_dir).startswith(PRIVATE_ROOTS):
            raise ValueError(f"{work_dir} is under {PRIVATE_ROOTS}, which each host replaces with its own")
        self.owns_work_dir = work_dir is None
        work_dir = work_dir or tempfile.mkdtemp(prefix="streambatch-cluster-", dir="/var/tmp")
        super().__init__(work_dir, workers=workers, cores=cores, memory=memory, worker_conf=worker_conf)
        self.hosts: list[Host] = []  # workers, in index order
        self.drivers: dict[int, Host] = {}  # by driver pid
        self.last_logs: dict[str, str] = {}

    def shared_dir(self, name: str) -> str:
        """A directory every host sees (under the cluster's work dir, removed with it)."""
        path = os.path.join(self.work_dir, "shared", name)
        os.makedirs(path, mode=0o700, exist_ok=True)
        return path

    def start(self, timeout: float = 90) -> NamespacedCluster:
        """Start master and workers; on any failure everything started is stopped, logs quoted."""
        try:
            super().start(timeout)
        except BaseException as exc:
            self.stop()
            if not isinstance(exc, Exception):  # Ctrl-C and the like: cleaned up, passed on as is
                raise
            tails = "\n".join(f"--- {name}\n{tail}" for name, tail in self.last_logs.items())
            raise RuntimeError(f"cluster start failed: {exc!r}\n{tails}") from exc
        return self

    def alive_workers(self) -> int:
        """As the master's /json/ says; 0 while it still serves its HTML page there (right after start)."""
        try:
            return super().alive_workers()
        except ValueError:
            return 0

    def _spawn(self, name: str, *args: str, conf: dict[str, str] | None = None) -> None:
        if not name.startswith("worker-"):
            super()._spawn(name, *args, conf=conf)
            return
        spark_class = os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")
        with open(os.path.join(self.work_dir, f"{name}.log"), "w") as log:
            proc = subprocess.Popen([*HOST_WRAPPER, spark_class, *args], env=host_env(self._env(conf)), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        self.hosts.append(_enter(name, proc))

    def namespace(self, worker: int) -> str:
        """The worker's ``mnt:[inode]``, as ``os.readlink('/proc/self/ns/mnt')`` shows it inside the worker."""
        return self.hosts[worker].namespace

    def worker_namespace_pids(self, worker: int) -> list[int]:
        """Every live process of that host: worker daemon, executors, Python workers, detached helpers."""
        return self.hosts[worker].pids()

    def host_files(self, worker: int, roots: tuple[str, ...] = PRIVATE_ROOTS) -> list[str]:
        """Every path under ``roots`` as that worker sees them (Spark's own entries included)."""
        return self.hosts[worker].files(roots)

    def kill_host(self, worker: int) -> None:
        """SIGKILL every process of that host, as if the machine died; its namespace stays readable."""
        self.hosts[worker].kill()

    def executor_pids(self) -> list[int]:
        """Executor JVMs of this cluster only (other clusters' executors live in other namespaces)."""
        ours = {host.namespace for host in self.hosts}
        return [pid for pid in super().executor_pids() if mount_namespace(pid) in ours]

    def run_driver(self, args: list[str], env: dict | None = None) -> subprocess.Popen:
        """Start ``args`` (e.g. ``[sys.executable, script, ...]``) as a driver on its own private host.

        stdout and stderr come merged on ``proc.stdout`` (text). The namespace is held until ``stop()``,
        so ``driver_files`` works after the driver exited."""
        full_env = host_env({**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
                             **(env or {})})
        proc = subprocess.Popen([*HOST_WRAPPER, *args], env=full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            self.drivers[proc.pid] = _enter(f"driver-{proc.pid}", proc)
        except RuntimeError:
            proc.kill()
            proc.communicate()
            raise
        return proc

    def driver_namespace(self, driver: subprocess.Popen) -> str:
        return self.drivers[driver.pid].namespace

    def driver_files(self, driver: subprocess.Popen, roots: tuple[str, ...] = PRIVATE_ROOTS) -> list[str]:
        """Every path under ``roots`` as that driver's host sees them, even after the driver exited."""
        return self.drivers[driver.pid].files(roots)

    def stop(self) -> None:
        """Kill every host (by namespace), the master and workers (by process group); unmount; remove work_dir."""
        try:
            for host in [*self.hosts, *self.drivers.values()]:
                host.release()
            super().stop()
        finally:
            for host in [*self.hosts, *self.drivers.values()]:
                if host.ns_fd >= 0:
                    os.close(host.ns_fd)
                    host.ns_fd = -1
            self.hosts.clear()
            self.drivers.clear()
            self._keep_log_tails()
            if self.owns_work_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def _keep_log_tails(self, chars: int = 3000) -> None:
        if not os.path.isdir(self.work_dir):
            return
        for name in sorted(os.listdir(self.work_dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.work_dir, name), errors="replace") as f:
                    self.last_logs[name] = f.read()[-chars:]
