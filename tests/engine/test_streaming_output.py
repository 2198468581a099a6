"""Streaming task output: blocks leave a running task as it cuts them, under memory grants.

One input that explodes into many blocks (a video into frames) must neither hold its
whole output nor wait until it ends before the next operator starts; a retried task
must not deliver twice what its first attempt already passed on.
"""

from __future__ import annotations

import logging
import os
import time
from functools import partial

import pyarrow as pa
from cluster_job import first_time

import airflow_streambatch.engine as sb

MiB = 1 << 20


def _explode(batch, frames: int, log_dir: str, fail_after: int | None = None, marker_dir: str | None = None,
             open_s: float = 0.0):
    """Each input row becomes ``frames`` rows of 1 MiB, produced one at a time."""
    for source in batch["id"].to_pylist():
        time.sleep(open_s)
        for i in range(frames):
            if fail_after is not None and i == fail_after and first_time(marker_dir, f"failed-{source}"):
                raise RuntimeError(f"decoder crashed on input {source} at frame {i}")
            time.sleep(0.01)
            yield pa.table({"source": [source], "frame": [i], "data": pa.array([bytes(MiB)], pa.binary())})
    with open(os.path.join(log_dir, f"producer-end-{os.getpid()}-{time.time()}"), "w"):
        pass


def _consume(batch, log_dir: str):
    with open(os.path.join(log_dir, f"consumer-start-{os.getpid()}-{time.time()}"), "w"):
        pass
    time.sleep(0.02 * batch.num_rows)
    return pa.table({"source": batch["source"], "frame": batch["frame"]})


def _times(log_dir, prefix):
    return [float(name.rsplit("-", 1)[1]) for name in os.listdir(log_dir) if name.startswith(prefix)]


def _pipeline(log_dir, inputs: int, frames: int, **explode):
    return (
        sb.range(inputs, override_num_blocks=inputs)
        .map_batches(partial(_explode, frames=frames, log_dir=str(log_dir), **explode), batch_size=1,
                     batch_format="pyarrow")
        .map_batches(partial(_consume, log_dir=str(log_dir)), num_cpus=0.5, batch_format="pyarrow")
    )


def test_one_exploding_input_streams_through_a_limit_a_fifth_of_its_size(ctx, tmp_path):
    ctx.scheduling_policy = "conservative"
    ctx.memory_limit = 8 * MiB
    ctx.target_max_block_size = MiB
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    ds = _pipeline(log_dir, inputs=1, frames=40)
    rows = ds.take_all()
    assert sorted(r["frame"] for r in rows) == list(range(40))
    stats = ds.last_run_stats
    assert stats.ops[0].bytes_out >= 40 * MiB and stats.ops[0].tasks_done == 1
    # grants before the first block assume blocks of the target size; these are a row each,
    # 22 bytes over it, so eight of them may pass the limit by those bytes and no more
    assert 0 < stats.peak_memory_bytes <= 8 * MiB + 8 * 64
    # the consumer ran on the first blocks while the one producing task was still running
    assert min(_times(log_dir, "consumer-start")) < max(_times(log_dir, "producer-end"))


def test_a_retried_task_delivers_the_blocks_its_first_attempt_streamed_once(ctx, tmp_path):
    ctx.memory_limit = 6 * MiB
    ctx.target_max_block_size = MiB
    log_dir, markers = tmp_path / "log", tmp_path / "markers"
    log_dir.mkdir()
    markers.mkdir()
    ds = _pipeline(log_dir, inputs=2, frames=20, fail_after=12, marker_dir=str(markers))
    rows = ds.take_all()
    assert sorted(os.listdir(markers)) == ["failed-0", "failed-1"]  # both first attempts died mid-stream
    assert sorted((r["source"], r["frame"]) for r in rows) == [(s, f) for s in range(2) for f in range(20)]


def test_a_limit_smaller_than_a_bundle_warns_and_still_finishes(ctx, tmp_path, caplog):
    """The consumer needs 4 blocks per task (``batch_size``) but only 2 fit: the producer
    waits for memory the consumer can only free once it has run, so the scheduler writes
    over the limit rather than deadlock, and says which setting to raise."""
    ctx.memory_limit = 2 * MiB
    ctx.target_max_block_size = MiB
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    ds = (
        sb.range(1, override_num_blocks=1)
        .map_batches(partial(_explode, frames=8, log_dir=str(log_dir)), batch_size=1, batch_format="pyarrow")
        .map_batches(partial(_consume, log_dir=str(log_dir)), num_cpus=0.5, batch_size=4, batch_format="pyarrow")
    )
    with caplog.at_level(logging.WARNING, logger="airflow_streambatch.engine.progress"):
        assert ds.count() == 8
    assert any("Raise DataContext.memory_limit" in r.getMessage() for r in caplog.records)


def test_tasks_run_in_turn_in_one_spark_job_each_hand_over_their_block_when_they_end(ctx, tmp_path, caplog):
    """Short tasks share a Spark job, several in turn per partition. Each writes a single
    block, its last: the driver must learn of it (and take back the task's unused
    reservation) when the task ends, not when the job does, or it counts none of those
    blocks against the limit and the next task in the partition waits for memory in vain."""
    ctx.scheduling_policy = "conservative"
    ctx.memory_limit = 12 * MiB  # three tasks' blocks
    ctx.target_max_block_size = 4 * MiB
    # fewer read slots than the tasks memory allows, and grouping even when a job's overhead
    # is small: several tasks in turn per Spark partition is the case under test
    ctx.resources = {"CPU": 2}
    ctx.scheduling_overhead_bound = 0.01
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    ds = _pipeline(log_dir, inputs=16, frames=4, open_s=1.2)  # the stall guard waits 1 s
    with caplog.at_level(logging.WARNING, logger="airflow_streambatch.engine.progress"):
        assert ds.count() == 64
    stats = ds.last_run_stats
    assert 0 < stats.peak_memory_bytes <= 12 * MiB
    assert not [r for r in caplog.records if "memory_limit" in r.getMessage()]
