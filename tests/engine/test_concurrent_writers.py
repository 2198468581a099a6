"""Two writers at once: one output path has one writer (its lease), two paths never interfere.

Issue 15, item 4: two epochs of one DAG run at once (``max_active_runs=2``) on one
worker, or the same epoch is triggered twice. The writers are real processes (a
second Python interpreter running a slow write on its own local Spark), the lease is
the real file, and a dead holder is really SIGKILLed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as sb
from airflow_streambatch.engine.output.commit import PartitionCommitter
from airflow_streambatch.engine.output.lease import LEASE_FILE, WriteLeaseHeldError

HERE = os.path.dirname(os.path.abspath(__file__))

_SLOW_WRITER = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
sys.path.insert(0, {tests!r})
import airflow_streambatch.engine as sb
from test_concurrent_writers import slow
ctx = sb.DataContext(block_dir={blocks!r}, progress_interval_s=0, resources={{"CPU": 2}})
with ctx.scoped():
    ds = sb.range({rows}, override_num_blocks={parts}).map_batches(slow, batch_format="pyarrow")
    result = ds.write_parquet({out!r}, mode="resume")
print("committed", len(result.committed), flush=True)
"""

_LEASE_HOLDER = """
import time
from airflow_streambatch.engine.output.target import OutputTarget
target = OutputTarget.open({out!r})  # a writer's first step: the lease, then (here) nothing but waiting
time.sleep(600)
"""


_EPOCH_WRITER = """
import json, os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
sys.path.insert(0, {tests!r})
import airflow_streambatch.engine as sb
from airflow_streambatch.epochs import EpochManifest, run_epoch
manifest = EpochManifest.from_dict(json.loads({manifest!r}))
ctx = sb.DataContext(block_dir={blocks!r}, progress_interval_s=0, resources={{"CPU": 2}})
with ctx.scoped():
    record = run_epoch(manifest, "test_concurrent_writers:slow_pipeline", output_path={out!r})
print("epoch", record.status, flush=True)
"""


def slow(batch):
    time.sleep(1.0)
    return batch


def slow_pipeline(ds, epoch):
    return ds.map_batches(slow, batch_format="pyarrow")


def _ids(path) -> list[int]:
    return sorted(pq.read_table(str(path))["id"].to_pylist())


def _start(script: str, log_path) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen) -> None:
    """Kill a writer this test started, and its Spark JVM (a child of it), if they still run."""
    if proc.poll() is None:
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        proc.kill()
        proc.wait(timeout=30)
        for pid in children:
            subprocess.run(["kill", "-9", pid], check=False)


def _slow_writer(tmp_path, out, rows: int, parts: int) -> subprocess.Popen:
    script = _SLOW_WRITER.format(tests=HERE, blocks=str(tmp_path / "blocks"), out=str(out), rows=rows, parts=parts)
    return _start(script, tmp_path / f"writer-{out.name}.log")


def _await_commits(proc: subprocess.Popen, out, at_least: int, log_path, bound_s: float = 240) -> None:
    deadline = time.monotonic() + bound_s
    while len(list(out.glob("p*/_commit.json"))) < at_least:
        if proc.poll() is not None:
            pytest.fail(f"the writer exited ({proc.returncode}) before committing: {log_path.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"the writer committed nothing within {bound_s} s: {log_path.read_text()[-3000:]}")
        time.sleep(0.05)


def _await_exit(proc: subprocess.Popen, log_path, bound_s: float = 240) -> None:
    try:
        proc.wait(timeout=bound_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the writer did not finish within {bound_s} s: {log_path.read_text()[-3000:]}")
    assert proc.returncode == 0, log_path.read_text()[-3000:]


def _hold_lease(tmp_path, out) -> subprocess.Popen:
    proc = _start(_LEASE_HOLDER.format(out=str(out)), tmp_path / "holder.log")
    deadline = time.monotonic() + 60
    while not (out / LEASE_FILE).exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            pytest.fail(f"the lease holder never took the lease: {(tmp_path / 'holder.log').read_text()}")
        time.sleep(0.02)
    return proc


def test_a_second_writer_of_the_same_path_is_refused_at_once_then_waits_and_resumes_nothing(ctx, tmp_path,
                                                                                         caplog):
    out = tmp_path / "out"
    log_path = tmp_path / "writer-out.log"
    writer = _slow_writer(tmp_path, out, rows=160, parts=16)
    try:
        _await_commits(writer, out, 1, log_path)
        lease = json.loads((out / LEASE_FILE).read_text())
        assert lease["pid"] == writer.pid
        ds = sb.range(160, override_num_blocks=16)
        before = len(list(out.glob("p*/_commit.json")))
        for mode in ("resume", "overwrite", "append"):
            started = time.monotonic()
            with pytest.raises(WriteLeaseHeldError) as refused:
                ds.write_parquet(str(out), mode=mode)
            assert time.monotonic() - started < 5, "the default is to refuse at once, not to wait"
            message = str(refused.value)
            for part in (str(out), f"pid {writer.pid}", f"run {lease['run_id']}", "DataContext.write_lease_timeout_s",
                         f"{out}/_lease"):
                assert part in message, (part, message)
        assert len(list(out.glob("p*/_commit.json"))) >= before, "the refused overwrite deleted commits"
        assert writer.poll() is None, "the writer finished before the waiting write started: make it slower"
        ctx.write_lease_timeout_s = 240
        with caplog.at_level(logging.WARNING, logger="airflow_streambatch.engine.progress"):
            result = ds.write_parquet(str(out), mode="resume")
        assert "waiting up to 240 s (DataContext.write_lease_timeout_s)" in caplog.text
        assert result.committed == {} and sorted(result.skipped) == list(range(16))  # all done by the first writer
        _await_exit(writer, log_path)
    finally:
        _stop(writer)
    assert "committed 16" in log_path.read_text()
    assert _ids(out) == list(range(160))  # every row exactly once
    assert not (out / LEASE_FILE).exists() and not (out / "_staging").exists()  # emptied, then removed


def test_a_lease_left_by_a_killed_writer_is_taken_over_by_the_next_write(ctx, tmp_path, caplog):
    out = tmp_path / "out"
    holder = _hold_lease(tmp_path, out)
    try:
        with pytest.raises(WriteLeaseHeldError, match=f"pid {holder.pid}"):
            sb.range(40, override_num_blocks=4).write_parquet(str(out), mode="resume")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    assert json.loads((out / LEASE_FILE).read_text())["pid"] == holder.pid  # SIGKILL cleaned nothing up
    with caplog.at_level(logging.WARNING, logger="airflow_streambatch.engine.progress"):
        result = sb.range(40, override_num_blocks=4).write_parquet(str(out), mode="resume")
    assert "taking over the write lease" in caplog.text and f"pid {holder.pid}" in caplog.text
    assert sorted(result.committed) == [0, 1, 2, 3]
    assert _ids(out) == list(range(40)) and not (out / LEASE_FILE).exists()


def test_two_epochs_written_at_once_by_two_processes_share_the_block_dir_without_interfering(ctx, tmp_path):
    first, second = tmp_path / "out" / "epoch-1", tmp_path / "out" / "epoch-2"
    log_path = tmp_path / "writer-epoch-1.log"
    writer = _slow_writer(tmp_path, first, rows=240, parts=24)
    try:
        _await_commits(writer, first, 1, log_path)
        ctx.block_dir = str(tmp_path / "blocks")  # the same block dir: this run's start sweeps it
        result = sb.range(40, override_num_blocks=4).write_parquet(str(second), mode="resume")
        assert sorted(result.committed) == [0, 1, 2, 3] and _ids(second) == list(range(40))
        # the sweeps of the second run (blocks, and staging under its own path) ran while the first was live
        assert writer.poll() is None, "the first writer finished before the second ran: make it slower"
        live_runs = [d for d in os.listdir(tmp_path / "blocks") if d.startswith("run-")]
        assert len(live_runs) == 1 and (first / "_staging" / live_runs[0][len("run-"):]).is_dir()
        _await_exit(writer, log_path)
    finally:
        _stop(writer)
    assert "committed 24" in log_path.read_text()
    assert _ids(first) == list(range(240))
    assert [d for d in os.listdir(tmp_path / "blocks") if d.startswith("run-")] == []  # each run removed its own


def test_a_full_recompute_never_deletes_under_a_live_writer(tmp_path):
    out = tmp_path / "out"
    holder = _hold_lease(tmp_path, out)
    try:
        with pytest.raises(WriteLeaseHeldError, match=f"cannot delete the committed partitions of {out}.*pid "
                                                       f"{holder.pid}"):
            PartitionCommitter(str(out), run_id="wipe").wipe()
    finally:
        _stop(holder)
    PartitionCommitter(str(out), run_id="wipe").wipe()  # its holder is dead now: nothing to protect


def test_a_lease_of_another_host_is_never_taken_over_and_the_error_says_how_to_remove_it(ctx, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    since = time.time() - 3600
    (out / LEASE_FILE).write_text(json.dumps({"host": "worker-7.example", "pid": 4242, "run_id": "abc123",
                                               "since": since, "token": "t" * 32}))
    with pytest.raises(WriteLeaseHeldError) as refused:
        sb.range(10, override_num_blocks=1).write_parquet(str(out), mode="resume")
    message = str(refused.value)
    for part in ("host worker-7.example", "pid 4242", "run abc123", "3600 s ago", "cannot check",
                 f"delete {out}/_lease by hand"):
        assert part in message, (part, message)
    assert json.loads((out / LEASE_FILE).read_text())["token"] == "t" * 32


def test_write_lease_timeout_is_checked_when_set():
    with pytest.raises(ValueError, match="DataContext.write_lease_timeout_s must be a number of seconds >= 0"):
        sb.DataContext(write_lease_timeout_s=-1)
    assert sb.DataContext().write_lease_timeout_s == 0


def test_the_same_epoch_run_twice_at_once_commits_each_partition_once(ctx, tmp_path):
    from datetime import datetime, timezone

    from airflow_streambatch.epochs import EpochCheckpoint, EpochManifest, list_inputs, run_epoch

    inputs, out = tmp_path / "in", tmp_path / "out" / "2026-11-22"
    for i in range(12):
        inputs.mkdir(exist_ok=True)
        pq.write_table(pa.table({"id": list(range(10 * i, 10 * i + 10))}), inputs / f"part-{i:03d}.parquet")
    manifest = EpochManifest("2026-11-22T10:00:00+00:00", datetime(2026, 11, 22, 11, tzinfo=timezone.utc).isoformat(),
                             list_inputs(str(inputs)))
    log_path = tmp_path / "epoch-writer.log"
    first = _start(_EPOCH_WRITER.format(tests=HERE, manifest=json.dumps(manifest.to_dict()),
                                        blocks=str(tmp_path / "blocks"), out=str(out)), log_path)
    try:
        _await_commits(first, out, 1, log_path)
        with pytest.raises(WriteLeaseHeldError, match=f"pid {first.pid}"):
            run_epoch(manifest, slow_pipeline, output_path=str(out))
        _await_exit(first, log_path)
    finally:
        _stop(first)
    assert "epoch succeeded" in log_path.read_text()
    assert _ids(out) == list(range(120))  # each partition committed once, by the first run
    record = EpochCheckpoint(str(out)).load()
    assert record.status == "succeeded" and len(record.by_state("committed")) == 12
