"""Faults injected into a real Spark standalone cluster: a master and two workers
started by the test, a pipeline in its own driver process, and then a killed
executor, a killed Python worker, UDF errors on chosen partitions, a corrupt file.
Every test checks the committed output holds each expected row exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from standalone_cluster import StandaloneCluster

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster_job.py")
FILES, ROWS = 12, 50  # file f holds ids f*50 .. f*50+49 and is input partition f


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = StandaloneCluster(str(tmp_path_factory.mktemp("cluster"))).start()
    yield c
    c.stop()
    assert c.executor_pids() == [], "executors outlived the cluster"


@pytest.fixture()
def job_dirs(tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    for f in range(FILES):
        pq.write_table(pa.table({"id": list(range(f * ROWS, (f + 1) * ROWS))}), source / f"f{f:02d}.parquet")
    (tmp_path / "markers").mkdir()
    return tmp_path


def _start_job(cluster, dirs, mode="none", sleep_s=0.2, max_failed=0) -> subprocess.Popen:
    args = [sys.executable, JOB, cluster.url, str(dirs / "in"), str(dirs / "out"), str(dirs / "blocks"),
            str(dirs / "markers"), mode, str(sleep_s), str(max_failed)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=300)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, f"job printed no result:\n{out[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def _committed_ids(out_dir) -> list[int]:
    return sorted(pq.read_table(str(out_dir))["id"].to_pylist())


def test_killed_executor_mid_run_loses_nothing_and_duplicates_nothing(cluster, job_dirs):
    proc = _start_job(cluster, job_dirs, sleep_s=1.0)
    out = job_dirs / "out"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(out.glob("p*/_commit.json"))) < 2:
        time.sleep(0.2)
    victims = cluster.executor_pids()
    assert len(victims) == 2, "expected one executor per worker"
    os.kill(victims[0], 9)
    result = _finish(proc)
    assert result["committed"] == list(range(FILES)) and not result["failed"]
    assert _committed_ids(job_dirs / "out") == list(range(FILES * ROWS))


def test_killed_python_worker_is_retried(cluster, job_dirs):
    result = _finish(_start_job(cluster, job_dirs, mode="kill-python:130"))
    assert os.path.exists(job_dirs / "markers" / "killed-130")
    assert result["committed"] == list(range(FILES)) and not result["failed"]
    assert _committed_ids(job_dirs / "out") == list(range(FILES * ROWS))


def test_udf_errors_fail_only_their_partitions_and_a_rerun_completes(cluster, job_dirs):
    result = _finish(_start_job(cluster, job_dirs, mode="raise:60,420", max_failed=2))
    assert sorted(f["partition"] for f in result["failed"]) == [1, 8]
    assert all("poisoned row" in f["error"] for f in result["failed"])
    assert _committed_ids(job_dirs / "out") == [i for i in range(FILES * ROWS) if i // ROWS not in (1, 8)]
    rerun = _finish(_start_job(cluster, job_dirs))
    assert rerun["committed"] == [1, 8] and len(rerun["skipped"]) == FILES - 2
    assert _committed_ids(job_dirs / "out") == list(range(FILES * ROWS))


def test_corrupt_file_fails_its_partition_naming_the_file(cluster, job_dirs):
    (job_dirs / "in" / "f05.parquet").write_bytes(b"PAR1 truncated")
    result = _finish(_start_job(cluster, job_dirs, max_failed=1))
    assert [f["partition"] for f in result["failed"]] == [5]
    assert "f05.parquet" in result["failed"][0]["error"]
    assert _committed_ids(job_dirs / "out") == [i for i in range(FILES * ROWS) if i // ROWS != 5]
