"""The NamespacedCluster harness really simulates separate hosts: executors on different
workers see different /dev/shm, a host's files are invisible elsewhere, ``kill_host`` kills
every process of that host (detached helpers too) and ``stop`` leaves no process, namespace
or mount behind. Real Spark, real processes. Run as a script, this module is the driver.

The tests share one cluster and run in file order: the last two kill a host, then stop it all.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from namespaced_cluster import NamespacedCluster, mount_namespace, namespace_pids, namespaces_unsupported

PARTITIONS = 4
MARKER = "streambatch-harness-"

_why_not = namespaces_unsupported() if __name__ != "__main__" else None
pytestmark = pytest.mark.skipif(_why_not is not None, reason=f"private mount namespaces unavailable: {_why_not}")


def _probe(index, _rows):
    """Runs in a Python worker: leave a marker in this host's /dev/shm and a detached helper."""
    namespace = os.readlink("/proc/self/ns/mnt")
    with open(f"/dev/shm/{MARKER}{index}", "w") as f:
        f.write(namespace)
    helper = subprocess.Popen(["sleep", "300"], start_new_session=True, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)  # keep both executors busy, so each gets tasks
    yield {"partition": index, "host": socket.gethostname(), "ns": namespace, "helper": helper.pid}


def driver_main(master: str) -> None:
    from pyspark.sql import SparkSession

    with open(f"/dev/shm/{MARKER}driver", "w") as f:
        f.write("driver")
    spark = (
        SparkSession.builder.master(master).appName("streambatch-namespace-harness")
        .config("spark.executor.cores", "1").config("spark.cores.max", "2").config("spark.executor.memory", "512m")
        .config("spark.pyspark.python", sys.executable).config("spark.ui.enabled", "false")
        .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        .getOrCreate()
    )
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    deadline = time.time() + 120
    while sc._jsc.sc().getExecutorIds().size() < 2 and time.time() < deadline:
        time.sleep(0.2)
    rows = sc.parallelize(range(PARTITIONS), PARTITIONS).mapPartitionsWithIndex(_probe).collect()
    result = {"rows": rows, "driver_ns": os.readlink("/proc/self/ns/mnt"), "driver_shm": sorted(os.listdir("/dev/shm"))}
    print("RESULT " + json.dumps(result), flush=True)
    time.sleep(600)  # keep the application, its executors and Python workers alive; the test kills us


def _result(proc: subprocess.Popen) -> dict:
    """The driver's RESULT line; the driver stays up afterwards (read no further: it blocks on nothing)."""
    seen = []
    for line in proc.stdout:
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
        seen.append(line)
    raise AssertionError("driver printed no result:\n" + "".join(seen)[-4000:])


def _cmdlines(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                out.append(f.read().replace("\0", " "))
        except OSError:
            pass
    return "\n".join(out)


def _held_links() -> set[str]:
    links = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the fd listdir itself used
            pass
    return links


def _mounts() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return sorted(f.read().splitlines())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _markers(paths: list[str]) -> set[str]:
    return {os.path.basename(p) for p in paths if os.path.basename(p).startswith(MARKER)}


@pytest.fixture(scope="module")
def run():
    """One cluster, one driver run; file listings are taken right away so each test can read them."""
    mounts = _mounts()
    cluster = NamespacedCluster(workers=2, cores=1, memory="1g")
    try:
        cluster.start()
        driver = cluster.run_driver([sys.executable, os.path.abspath(__file__), cluster.url])
        result = _result(driver)
        yield SimpleNamespace(
            cluster=cluster, mounts=mounts, result=result, driver_ns=cluster.driver_namespace(driver),
            host_files=[cluster.host_files(w) for w in range(2)], driver_files=cluster.driver_files(driver),
            work_dir=cluster.work_dir)
    finally:
        cluster.stop()


def test_each_worker_and_the_driver_is_a_private_host(run):
    rows, hosts = run.result["rows"], [run.cluster.namespace(w) for w in range(2)]
    assert len(hosts) == len(set(hosts)) == 2 and mount_namespace() not in hosts
    assert {row["ns"] for row in rows} == set(hosts), "tasks did not run on both workers' namespaces"
    for worker in range(2):
        ran_here = {f"{MARKER}{row['partition']}" for row in rows if row["ns"] == hosts[worker]}
        assert _markers(run.host_files[worker]) == ran_here
    assert run.result["driver_ns"] == run.driver_ns and run.driver_ns not in hosts
    assert _markers(run.driver_files) == {f"{MARKER}driver"} == _markers(run.result["driver_shm"])
    assert not _markers(os.listdir("/dev/shm")) and not _markers(os.listdir("/tmp"))
    assert any(p.startswith("/tmp/") for p in run.host_files[0]), "Spark wrote nothing to the private /tmp"


def test_kill_host_kills_every_process_of_that_host_only(run):
    cluster, rows = run.cluster, run.result["rows"]
    helpers = {w: [r["helper"] for r in rows if r["ns"] == cluster.namespace(w)] for w in range(2)}
    assert all(_alive(pid) and mount_namespace(pid) == cluster.namespace(0) for pid in helpers[0])
    assert os.getsid(helpers[0][0]) == helpers[0][0], "helper is not detached"
    doomed = cluster.worker_namespace_pids(0)
    assert set(helpers[0]) < set(doomed)
    for part in ("deploy.worker.Worker", "CoarseGrainedExecutorBackend", "pyspark.daemon"):
        assert part in _cmdlines(doomed), f"no {part} on host 0"
    cluster.kill_host(0)
    assert cluster.worker_namespace_pids(0) == [] and not any(_alive(pid) for pid in doomed)
    assert all(_alive(pid) for pid in helpers[1]), "the other host was hit"
    deadline = time.time() + 90
    while cluster.alive_workers() != 1 and time.time() < deadline:
        time.sleep(0.5)
    assert cluster.alive_workers() == 1
    assert _markers(cluster.host_files(0)), "a killed host's namespace should stay readable until stop()"


def test_stop_leaves_no_process_namespace_or_mount(run):
    cluster = run.cluster
    namespaces = [cluster.namespace(w) for w in range(2)] + [run.driver_ns]
    pids = [pid for ns in namespaces for pid in namespace_pids(ns)]
    assert pids, "worker 1 should still be running"
    cluster.stop()
    assert not any(_alive(pid) for pid in pids)
    assert all(namespace_pids(ns) == [] for ns in namespaces)
    assert not _held_links() & set(namespaces), "a namespace handle is still open"
    assert _mounts() == run.mounts
    assert not os.path.exists(run.work_dir)


if __name__ == "__main__":
    driver_main(sys.argv[1])
