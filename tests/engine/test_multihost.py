"""Pipelines on a cluster whose hosts share no /tmp or /dev/shm: a master, two workers and the
driver, each worker and the driver in its own mount namespace (`namespaced_cluster.py`),
with engine defaults (blocks in each host's own tmpfs). Blocks reach consumers on other
hosts through the host agents, grants travel over the control plane, and each run holds
every row exactly once, in bounded time, with nothing left on either worker.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from namespaced_cluster import NamespacedCluster, namespaces_unsupported
from ports import free_port_range

pytestmark = pytest.mark.skipif(namespaces_unsupported() is not None,
                                reason=f"separate hosts need mount namespaces: {namespaces_unsupported()}")

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_job.py")
FILES, ROWS = 8, 60
RUN_BOUND_S = 240  # a run that takes longer hangs: the test fails instead of waiting forever


@pytest.fixture(scope="module")
def cluster():
    c = NamespacedCluster(workers=2, cores=2)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture()
def data(cluster, request):
    root = cluster.shared_dir(request.node.name.replace("[", "-").replace("]", ""))
    os.makedirs(f"{root}/in")
    for f in range(FILES):
        pq.write_table(pa.table({"id": list(range(f * ROWS, (f + 1) * ROWS))}), f"{root}/in/f{f}.parquet")
    return root


def _run(cluster, data, mode, sleep_s=0.05):
    proc = cluster.run_driver([sys.executable, JOB, cluster.url, f"{data}/in", f"{data}/out", mode, str(sleep_s)])
    return proc


def _result(proc) -> dict:
    try:
        out, _ = proc.communicate(timeout=RUN_BOUND_S)
    except Exception:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the run did not end within {RUN_BOUND_S} s:\n{out[-4000:]}")
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the run printed no result:\n{out[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def _engine_files(cluster, worker: int) -> list[str]:
    return [p for p in cluster.host_files(worker) if os.path.basename(p).startswith("streambatch")
            or "/streambatch-" in p]


def _assert_nothing_left(cluster, workers=(0, 1), bound_s: float = 40.0) -> None:
    """Host agents remove a run's blocks, then themselves, once the driver is gone."""
    deadline = time.monotonic() + bound_s
    while True:
        left = {w: _engine_files(cluster, w) for w in workers}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"files left on the workers {bound_s:.0f} s after the run: {left}"
        time.sleep(1)


def _ids_once(rows) -> None:
    ids = sorted(i for i, _ in rows)
    assert ids == list(range(FILES * ROWS)), "rows lost or duplicated"


def _crossed_hosts(rows) -> bool:
    """Some row was handled by tasks on two different hosts (its block moved between them)."""
    return any(len(set(h.split(","))) > 1 for _, h in rows)


def test_a_three_operator_pipeline_writes_every_row_once(cluster, data):
    result = _result(_run(cluster, data, "write"))
    assert result["committed"] == list(range(FILES))
    table = pq.read_table(f"{data}/out")
    rows = list(zip(table["id"].to_pylist(), table["hosts"].to_pylist()))
    _ids_once(rows)
    assert _crossed_hosts(rows) and result["cross_host_bytes"] > 0
    _assert_nothing_left(cluster)


def test_input_and_output_on_s3_with_no_shared_directory_at_all(cluster, s3_bucket):
    """Every host (the driver and both workers) reaches the S3 server; none shares a directory."""
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs

    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    for f in range(FILES):
        pq.write_table(pa.table({"id": list(range(f * ROWS, (f + 1) * ROWS))}), f"{bucket}/in/f{f}.parquet",
                       filesystem=fs)
    result = _result(_run(cluster, s3_bucket, "write"))
    assert result["committed"] == list(range(FILES))
    table = pads.dataset(f"{bucket}/out", filesystem=fs, ignore_prefixes=["_", "."]).to_table()
    rows = list(zip(table["id"].to_pylist(), table["hosts"].to_pylist()))
    _ids_once(rows)
    assert _crossed_hosts(rows)
    _assert_nothing_left(cluster)


@pytest.mark.parametrize("mode", ["iter_batches"])  # take_all: test_tls_and_fixed_ports_between_separate_hosts
def test_the_driver_reads_blocks_from_both_hosts(cluster, data, mode):
    result = _result(_run(cluster, data, mode))
    _ids_once(result["rows"])
    hosts = {h for _, hs in result["rows"] for h in hs.split(",")}
    assert len(hosts) == 2 and result["driver_namespace"] not in hosts
    _assert_nothing_left(cluster)


def test_pieces_of_one_block_are_read_by_tasks_on_both_hosts(cluster, data):
    """One file is one read task on one host; the model's idle copies take slices of its blocks,
    read through the host agent where they run elsewhere: every row once."""
    result = _result(_run(cluster, data, "pieces", sleep_s=0.5))
    ids = sorted(i for i, _ in result["rows"])
    assert ids == list(range(ROWS)), "rows lost or duplicated"
    assert result["model_tasks"] > 2  # two blocks of ~30 rows, cut for four slots
    assert _crossed_hosts(result["rows"])  # slices of one host's blocks were read on the other
    _assert_nothing_left(cluster)


def test_a_materialized_dataset_is_read_twice(cluster, data):
    result = _result(_run(cluster, data, "materialize"))
    _ids_once(result["rows"])
    _ids_once(result["rows_again"])
    assert sorted(result["rows"]) == sorted(result["rows_again"])  # read back, not recomputed
    _assert_nothing_left(cluster)


def test_tls_and_fixed_ports_between_separate_hosts(cluster, data):
    """The driver's control plane and both workers' host agents listen on ports of their ranges
    (``control_ports``, ``agent_ports``) and speak TLS only; the driver reads (``take_all``) blocks
    from both hosts, every row once."""
    control, agents = free_port_range(2), free_port_range(4)
    network = {"tls": True, "control_ports": f"{control[0]}-{control[-1]}", "agent_ports": f"{agents[0]}-{agents[-1]}"}
    proc = cluster.run_driver([sys.executable, JOB, cluster.url, f"{data}/in", f"{data}/out", "take_all", "0.05"],
                              env={"STREAMBATCH_TEST_NETWORK": json.dumps(network)})
    result = _result(proc)
    _ids_once(result["rows"])
    hosts = {h for _, hs in result["rows"] for h in hs.split(",")}
    assert len(hosts) == 2 and result["driver_namespace"] not in hosts
    assert _crossed_hosts(result["rows"]) and result["cross_host_bytes"] > 0
    probe = result["network"]
    assert probe["control_uri"].startswith("grpc+tls://")
    assert int(probe["control_uri"].rsplit(":", 1)[1]) in control
    assert len(probe["agents"]) == 2, f"expected one agent per worker in {network['agent_ports']}: {probe}"
    assert all(a == {"tls": True, "plaintext": False} for a in probe["agents"].values()), probe
    _assert_nothing_left(cluster)


def test_a_killed_driver_leaves_nothing_on_the_workers(cluster, data):
    """The driver is SIGKILLed mid-run: nobody tells the host agents; they notice the driver
    is gone and remove their hosts' blocks, then themselves."""
    proc = _run(cluster, data, "write", sleep_s=0.4)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(_engine_files(cluster, w) for w in (0, 1)):
        time.sleep(0.2)
    assert any(_engine_files(cluster, w) for w in (0, 1)), "no blocks were ever written on the workers"
    proc.kill()
    proc.communicate()
    _assert_nothing_left(cluster)


def test_a_host_killed_mid_run_loses_no_row_and_duplicates_none(cluster, data):
    """Host 1 dies (every process in it) while the pipeline runs: its blocks are gone with
    it; lineage rebuilds them on host 0 and the run commits every row once. Runs last: the
    module's cluster has one worker afterwards."""
    proc = _run(cluster, data, "write", sleep_s=0.4)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(glob.glob(f"{data}/out/p*/_commit.json")) < 2:
        time.sleep(0.2)
    cluster.kill_host(1)
    result = _result(proc)
    assert result["committed"] == list(range(FILES))
    table = pq.read_table(f"{data}/out")
    _ids_once(list(zip(table["id"].to_pylist(), table["hosts"].to_pylist())))
    _assert_nothing_left(cluster, workers=(0,))
