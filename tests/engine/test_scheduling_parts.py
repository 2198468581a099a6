"""The scheduler's parts, one at a time, without Spark: the group sizer, the map
operator's bundling rule, the resource pool, the partition tracker (with a real
committer on a tmp dir) and the stream watcher.

Forged records that point outside the run dir, at a link, or at another task's file
are covered in test_block_dir_security.py; here are the other ways a record can lie.
"""

from __future__ import annotations

import json
import math
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.errors import PartitionFailure
from airflow_streambatch.engine.execution.commit import PartitionCommitter
from airflow_streambatch.engine.execution.operators import build_operators
from airflow_streambatch.engine.execution.operators.map import MapOperator, task_key
from airflow_streambatch.engine.execution.partitions import PartitionTracker
from airflow_streambatch.engine.execution.resources import TASK_SLOTS, ResourcePool
from airflow_streambatch.engine.execution.stream_watcher import ForgedStreamRecordError, StreamWatcher, WatchedTask
from airflow_streambatch.engine.plan.logical import InputBlocks, MapBatches, ResourceRequest
from airflow_streambatch.engine.plan.planner import MapOp, plan
from airflow_streambatch.engine.spark.group_sizer import GroupSizer
from airflow_streambatch.engine.worker.blocks import STREAM_DIR, BlockRef
from airflow_streambatch.engine.worker.staging import StagedFile, schema_columns
from airflow_streambatch.engine.worker.streams import OutputStream, stream_name

# -- GroupSizer ---------------------------------------------------------------------------


def test_group_sizer_ignores_the_first_job():
    sizer = GroupSizer(bound=0.1, max_size=64)
    sizer.observe(wall_s=30.0, partition_work_s=[0.01], tasks=1)  # worker start-up
    assert sizer.job_overhead_s is None
    assert sizer.depth(task_s=0.01, ready=1000, slots=1) == 1
    assert sizer.overhead_per_task_s == pytest.approx(29.99)  # still reported


def test_group_sizer_depth_amortizes_the_overhead():
    sizer = GroupSizer(bound=0.1, max_size=64)
    sizer.observe(5.0, [0.1], 1)
    sizer.observe(wall_s=0.5, partition_work_s=[0.2, 0.3], tasks=2)  # overhead: 0.5 - 0.3
    assert sizer.job_overhead_s == pytest.approx(0.2)
    assert sizer.depth(task_s=0.1, ready=1000, slots=1) == math.ceil(0.2 / (0.1 * 0.1)) == 20
    assert sizer.depth(task_s=0.15, ready=1000, slots=1) == math.ceil(0.2 / (0.1 * 0.15)) == 14
    assert sizer.depth(task_s=2.0, ready=1000, slots=1) == 1  # seconds-long tasks: full pipelining
    sizer.observe(wall_s=1.2, partition_work_s=[0.0], tasks=1)  # moving average: 0.7 * 0.2 + 0.3 * 1.2
    assert sizer.job_overhead_s == pytest.approx(0.5)
    assert sizer.depth(task_s=0.1, ready=1000, slots=1) == 50


def test_group_sizer_depth_is_capped_by_max_size_and_ready_tasks_per_slot():
    sizer = GroupSizer(bound=0.1, max_size=8)
    sizer.observe(1.0, [], 1)
    sizer.observe(1.0, [], 1)  # one second of overhead per job
    assert sizer.depth(task_s=0.01, ready=1000, slots=1) == 8
    assert sizer.depth(task_s=0.01, ready=10, slots=4) == 3  # ceil(10 / 4)
    assert sizer.depth(task_s=0.01, ready=4, slots=4) == 1
    assert sizer.depth(task_s=0.01, ready=0, slots=0) == 1
    assert sizer.depth(task_s=0.0, ready=1000, slots=1) == 1  # no timing yet


def test_group_sizer_work_longer_than_wall_is_no_overhead():
    sizer = GroupSizer(bound=0.1, max_size=64)
    sizer.observe(1.0, [0.5], 1)
    sizer.observe(1.0, [3.0], 1)
    assert sizer.job_overhead_s == 0.0 and sizer.depth(0.001, 100, 1) == 1


def test_group_sizer_disabled_always_runs_one_task_per_partition():
    sizer = GroupSizer(bound=0.1, max_size=64, enabled=False)
    for _ in range(3):
        sizer.observe(10.0, [0.001], 1)
    assert sizer.depth(task_s=0.001, ready=1000, slots=1) == 1


# -- MapOperator bundling -----------------------------------------------------------------


def _identity(batch):
    return batch


def map_operator(tmp_path, cpus=1, batch_size=None, min_size=100, max_size=1000) -> MapOperator:
    ctx = DataContext(block_dir=str(tmp_path / "blocks"), target_min_block_size=min_size,
                      target_max_block_size=max_size, resources={"CPU": cpus}, progress_interval_s=0)
    transform = MapBatches(name="MapBatches(_identity)", compute=ResourceRequest.make("m", num_cpus=1),
                           fn=_identity, batch_size=batch_size)
    physical = plan([InputBlocks(blocks=()), transform])
    assert isinstance(physical[1], MapOp)
    operators = build_operators(physical, ctx, ResourcePool({"CPU": cpus}))
    op = operators[1]
    assert isinstance(op, MapOperator)
    return op


def blocks(n, size, rows=10, partition=lambda i: 0, start=0) -> list[BlockRef]:
    return [BlockRef(block_id=f"0:t{i}:0", path=f"/nowhere/{i}.arrow", num_rows=rows, size_bytes=size,
                     producer=("Read", f"t{i}", 0), partitions=(partition(i),)) for i in range(start, start + n)]


def queue(op, refs):
    op.inputs.extend(refs)
    return refs


def test_small_blocks_coalesce_until_target_min_block_size(tmp_path):
    op = map_operator(tmp_path, min_size=100)
    refs = queue(op, blocks(10, size=30))
    assert op._peek_bundle() == refs[:4]  # 120 >= 100
    assert op.next_task_input_bytes() == 120
    spec = op.next_task()
    assert spec.inputs == refs[:4] and spec.partitions == (0,) and spec.task_key == task_key(refs[:4])
    assert list(op.inputs) == refs[4:]
    assert op.next_task().inputs == refs[4:8]
    assert op._peek_bundle() == refs[8:]  # what is left, though under the target


def test_a_block_at_the_target_runs_alone(tmp_path):
    op = map_operator(tmp_path, min_size=100)
    refs = queue(op, blocks(3, size=100))
    assert op.next_task().inputs == refs[:1]


def test_bundles_never_pass_target_max_block_size(tmp_path):
    op = map_operator(tmp_path, min_size=1000, max_size=100)
    refs = queue(op, blocks(5, size=40))
    assert op._peek_bundle() == refs[:2]  # a third would make 120 > 100
    op.inputs.clear()
    big = queue(op, blocks(2, size=500))
    assert op._peek_bundle() == big[:1]  # a block over the cap still runs, alone


def test_bundles_keep_input_partitions_apart(tmp_path):
    op = map_operator(tmp_path, min_size=1000)
    refs = queue(op, blocks(6, size=10, partition=lambda i: i // 2))  # partitions 0 0 1 1 2 2
    assert op.next_task().inputs == refs[:2]
    spec = op.next_task()
    assert spec.inputs == refs[2:4] and spec.partitions == (1,)


def test_bundles_mix_partitions_only_when_allowed(tmp_path):
    op = map_operator(tmp_path, min_size=1000)
    op.mix_partitions = True
    refs = queue(op, blocks(6, size=10, partition=lambda i: i // 2))
    spec = op.next_task()
    assert spec.inputs == refs and spec.partitions == (0, 1, 2)


def test_batch_size_sets_the_least_rows_of_a_bundle(tmp_path):
    op = map_operator(tmp_path, batch_size=25, min_size=1)  # any block is big enough in bytes
    refs = queue(op, blocks(7, size=10, rows=10))
    assert op.min_rows == 25
    assert op.next_task().inputs == refs[:3]  # 30 rows >= 25
    assert op.next_task().inputs == refs[3:6]


def test_batch_size_rows_are_still_capped_by_max_block_size(tmp_path):
    op = map_operator(tmp_path, batch_size=100, min_size=1, max_size=35)
    refs = queue(op, blocks(7, size=10, rows=10))
    assert op._peek_bundle() == refs[:3]  # 40 bytes would pass the cap, though rows < 100


def test_bundles_spread_over_free_slots_when_there_is_no_backlog(tmp_path):
    op = map_operator(tmp_path, cpus=4, min_size=1000)
    refs = queue(op, blocks(8, size=10))
    assert op._blocks_per_task_cap() == 2  # 8 blocks over 4 free slots
    assert op._peek_bundle() == refs[:2]


def test_the_slot_cap_does_not_cut_a_bundle_under_batch_size(tmp_path):
    op = map_operator(tmp_path, cpus=4, batch_size=25, min_size=1000)
    refs = queue(op, blocks(4, size=10, rows=10))
    assert op._blocks_per_task_cap() == 1
    assert op._peek_bundle() == refs[:3]


def test_a_bundle_under_batch_size_waits_for_more_input_until_upstream_is_done(tmp_path):
    op = map_operator(tmp_path, batch_size=25, min_size=1)
    queue(op, blocks(2, size=30, rows=10))
    assert not op.has_input()  # 20 rows < 25 and more may come
    queue(op, blocks(1, size=30, rows=10, start=2))
    assert op.has_input()  # 30 rows
    op.inputs.clear()
    queue(op, blocks(1, size=30, rows=10))
    assert not op.has_input()
    op.upstream_done = True
    assert op.has_input()  # nothing more will join it
    assert op.next_task().inputs == list(blocks(1, size=30, rows=10))


def test_a_bundle_under_target_min_size_starts_when_it_holds_all_queued_blocks(tmp_path):
    """Bundling saves per-task overhead only with a backlog: a free slot never waits for
    more input to reach target_min_block_size (only batch_size makes a bundle wait)."""
    op = map_operator(tmp_path, min_size=100)
    refs = queue(op, blocks(2, size=30))
    assert op.has_input() and op._peek_bundle() == refs
    op.cut = True  # upstream of a satisfied limit: nothing launches
    assert not op.has_input()


def test_the_task_key_depends_on_the_inputs_only(tmp_path):
    refs = blocks(3, size=10)
    assert task_key(refs) == task_key(list(refs))
    assert task_key(refs) != task_key(refs[:2]) != task_key(refs[::-1])


# -- ResourcePool ---------------------------------------------------------------------------


def req(**kw) -> ResourceRequest:
    return ResourceRequest.make("op", **kw)


def test_slots_for_divides_what_is_free_by_the_request():
    pool = ResourcePool({"CPU": 4})
    assert pool.slots_for(1, req(num_cpus=1)) == 4
    assert pool.slots_for(1, req(num_cpus=0.5)) == 8
    assert pool.slots_for(1, req(num_cpus=3)) == 1
    pool.acquire(1, req(num_cpus=1))
    assert pool.slots_for(2, req(num_cpus=1)) == 3
    assert pool.slots_for(2, req(num_cpus=1), keep={"CPU": 2}) == 1
    assert pool.slots_for(2, req(num_cpus=1), keep={"CPU": 5}) == 0  # never negative


def test_slots_for_needs_every_resource_of_the_request():
    pool = ResourcePool({"CPU": 8, "GPU": 2})
    gpu_and_cpu = req(num_cpus=1, num_gpus=1)
    assert pool.slots_for(1, gpu_and_cpu) == 2  # GPUs bound it, not the 8 CPUs
    pool.acquire(2, req(num_cpus=7))
    assert pool.slots_for(1, gpu_and_cpu) == 1  # now the one CPU left does


def test_spark_task_slots_bound_fractional_cpus():
    pool = ResourcePool({"CPU": 2}, task_slots=2)
    half = req(num_cpus=0.5)
    assert pool.slots_for(1, half) == 2  # 4 by CPU, but Spark runs 2 partitions at once
    assert pool.slots_for(1, half, keep={TASK_SLOTS: 1}) == 1
    pool.acquire(1, half)
    assert pool.slots_for(2, half) == 1
    pool.acquire(2, half)
    assert pool.slots_for(1, half) == 0 and pool.used["CPU"] == 1.0


def test_concurrency_caps_one_operator_only():
    pool = ResourcePool({"CPU": 8})
    capped = req(num_cpus=1, concurrency=2)
    assert pool.slots_for(1, capped) == 2
    pool.acquire(1, capped)
    assert pool.slots_for(1, capped) == 1
    assert pool.slots_for(2, capped) == 2  # another operator's count
    pool.acquire(1, capped)
    assert pool.slots_for(1, capped) == 0
    pool.release(1, capped, ())
    assert pool.slots_for(1, capped) == 1
    assert pool.capacity_for(capped) == 2 and pool.capacity_for(req(num_cpus=1)) == 8


def test_gpu_ids_are_handed_out_distinct_and_returned():
    pool = ResourcePool({"CPU": 4, "GPU": 2})
    gpu = req(num_gpus=1)
    first, second = pool.acquire(1, gpu), pool.acquire(1, gpu)
    assert {first, second} == {("0",), ("1",)}
    assert pool.slots_for(1, gpu) == 0
    assert pool.acquire(2, req(num_cpus=1)) == ()  # a CPU task gets no GPU
    pool.release(1, gpu, first)
    assert pool.slots_for(1, gpu) == 1
    assert pool.acquire(1, gpu) == first  # the returned id, not a third one
    two = ResourcePool({"GPU": 4}).acquire(1, req(num_gpus=2))
    assert len(two) == 2 and len(set(two)) == 2


def test_check_feasible_names_the_setting():
    pool = ResourcePool({"CPU": 4})
    pool.check_feasible(req(num_cpus=4), "Map(f)")  # exactly enough: fine
    with pytest.raises(ValueError, match=r"Map\(f\) asks for GPU=1 per task but only 0 GPU.*"
                                         r"DataContext\.get_current\(\)\.resources.*'GPU': 1"):
        pool.check_feasible(req(num_gpus=1), "Map(f)")
    with pytest.raises(ValueError, match=r"CPU=5 per task but only 4 CPU"):
        pool.check_feasible(req(num_cpus=5), "Map(f)")
    with pytest.raises(ValueError, match=r"tpu=2\.5 .*'tpu': 3"):
        pool.check_feasible(req(resources={"tpu": 2.5}), "Embed")


# -- PartitionTracker -------------------------------------------------------------------------


def bref(block_id: str, *partitions: int) -> BlockRef:
    return BlockRef(block_id=block_id, path=f"/nowhere/{block_id}", num_rows=1, size_bytes=1,
                    producer=("Op", block_id, 0), partitions=tuple(partitions))


def failure(partition: int, error: str = "boom") -> PartitionFailure:
    return PartitionFailure(partition, f"file{partition}", "Map(f)", error)


def test_tracker_counts_reads_and_held_blocks():
    tracker = PartitionTracker(None)
    tracker.add_read(0, "a.parquet")
    assert tracker.outstanding[0] == 1 and tracker.label(0) == "a.parquet" and tracker.label(7) == "partition 7"
    block = bref("b1", 0)
    tracker.hold(block)
    tracker.hold(block)  # queued again downstream: still one thing outstanding
    assert tracker.outstanding[0] == 2
    tracker.read_done(0)
    tracker.drop(block)
    tracker.drop(block)  # dropped twice: counted once
    assert tracker.outstanding[0] == 0
    tracker.drop(bref("never-held", 0))
    assert tracker.outstanding[0] == 0


def test_tracker_mixed_blocks_hold_every_partition():
    tracker = PartitionTracker(None)
    mixed = bref("m", 1, 2)
    tracker.hold(mixed)
    assert (tracker.outstanding[1], tracker.outstanding[2]) == (1, 1)
    tracker.drop(mixed)
    assert (tracker.outstanding[1], tracker.outstanding[2]) == (0, 0)


def test_tracker_failures_keep_the_first_reason():
    tracker = PartitionTracker(None)
    tracker.fail(failure(3, "first"))
    tracker.fail(failure(3, "second"))
    assert tracker.failures[3].error == "first"
    assert tracker.is_failed((1, 3)) and not tracker.is_failed((1, 2)) and not tracker.is_failed(())


def stage(committer: PartitionCommitter, partition: int, table: pa.Table, name: str = "part-t.parquet"):
    directory = committer.staging_dir(partition)
    os.makedirs(directory, exist_ok=True)
    path = f"{directory}/{name}"
    pq.write_table(table, path)
    return StagedFile(path, table.num_rows, os.path.getsize(path), schema_columns(table.schema))


@pytest.fixture()
def committer(tmp_path):
    c = PartitionCommitter(str(tmp_path / "out"), run_id="r1")
    c.claim_staging()
    return c


def test_a_partition_commits_once_its_read_is_done_and_its_last_block_dropped(committer):
    tracker = PartitionTracker(committer, sink_name="Write")
    seen = []
    tracker.on_commit = seen.append
    tracker.add_read(0, "in/a.parquet", identity="fp-a")
    first, second = bref("b1", 0), bref("b2", 0)
    tracker.hold(first)
    tracker.add_files((0,), [stage(committer, 0, pa.table({"x": [1, 2, 3]}))])
    tracker.read_done(0)
    tracker.hold(second)
    tracker.drop(first)
    assert tracker.committed == {} and committer.committed() == {}  # a block still in flight
    tracker.drop(second)
    record = tracker.committed[0]
    assert record.rows == 3 and record.label == "in/a.parquet" and record.inputs == "fp-a"
    assert record.files == ["p00000/part-t.parquet"] and seen == [record]
    assert committer.committed()[0].rows == 3
    assert pq.read_table(os.path.join(committer.root, "p00000", "part-t.parquet")).num_rows == 3
    assert 0 not in tracker.files


def test_a_partition_with_no_blocks_commits_when_its_read_is_done(committer):
    tracker = PartitionTracker(committer)
    tracker.add_read(4, "empty.parquet")
    tracker.read_done(4)
    assert tracker.committed[4].rows == 0 and 4 in committer.committed()


def test_partitions_commit_independently(committer):
    tracker = PartitionTracker(committer)
    for p in (0, 1):
        tracker.add_read(p, f"f{p}")
    held = bref("b", 0)
    tracker.hold(held)
    tracker.read_done(0)
    tracker.read_done(1)
    assert set(tracker.committed) == {1}
    tracker.drop(held)
    assert set(tracker.committed) == {0, 1}


def test_a_failed_partition_never_commits(committer):
    tracker = PartitionTracker(committer)
    tracker.on_commit = lambda rec: pytest.fail(f"committed {rec}")
    tracker.add_read(2, "bad.parquet")
    block = bref("b", 2)
    tracker.hold(block)
    tracker.add_files((2,), [stage(committer, 2, pa.table({"x": [1]}))])
    tracker.fail(failure(2))
    tracker.read_done(2)
    tracker.drop(block)
    assert tracker.committed == {} and committer.committed() == {}
    assert not os.path.exists(os.path.join(committer.root, "p00002"))


def test_a_schema_mismatch_fails_the_partition_instead_of_committing(committer):
    tracker = PartitionTracker(committer, sink_name="WriteParquet")
    tracker.add_read(0, "a")
    tracker.add_read(1, "b")
    tracker.add_files((0,), [stage(committer, 0, pa.table({"x": [1]}))])
    tracker.add_files((1,), [stage(committer, 1, pa.table({"x": ["one"]}))])
    tracker.read_done(0)
    tracker.read_done(1)
    assert set(tracker.committed) == {0}
    assert tracker.failures[1].operator == "WriteParquet" and "SchemaMismatchError" in tracker.failures[1].error
    assert set(committer.committed()) == {0}


def test_an_on_commit_callback_that_raises_does_not_undo_the_commit(committer):
    tracker = PartitionTracker(committer)

    def broken(record):
        raise RuntimeError("observer bug")

    tracker.on_commit = broken
    tracker.add_read(0, "a")
    tracker.read_done(0)
    assert 0 in tracker.committed and 0 not in tracker.failures and 0 in committer.committed()


# -- StreamWatcher -----------------------------------------------------------------------------


@pytest.fixture()
def run_dir(tmp_path):
    d = tmp_path / "run-1"
    (d / STREAM_DIR).mkdir(parents=True)
    return str(d)


def task_block(run_dir, op_index, key, index, size=8, write=True, **changes) -> BlockRef:
    path = os.path.join(run_dir, f"{op_index}-{key}-{index}.arrow")
    if write:
        with open(path, "wb") as f:
            f.write(b"arrow")
    fields = dict(block_id=f"{op_index}:{key}:{index}", path=path, num_rows=2, size_bytes=size,
                  producer=(f"Op{op_index}", key, index), partitions=(0,))
    fields.update(changes)
    return BlockRef(**fields)


def watched(watcher, op_index, key, granted=100) -> tuple[WatchedTask, OutputStream]:
    name = stream_name(op_index, key, 1)
    task = WatchedTask(op_index, key, name, granted, 0.0, 0)
    watcher.watch(task)
    return task, OutputStream(watcher.run_dir, name, granted=granted, poll_s=0.001)


def test_poll_returns_announced_blocks_in_order(run_dir):
    watcher = StreamWatcher(run_dir)
    assert watcher.poll() == []
    a, out_a = watched(watcher, 1, "ka")
    b, out_b = watched(watcher, 2, "kb")
    assert watcher.poll() == []  # nothing written yet
    refs_a = [task_block(run_dir, 1, "ka", i, size=10 + i) for i in range(3)]
    ref_b = task_block(run_dir, 2, "kb", 0)
    for r in refs_a[:2]:
        out_a.announce(r)
    out_b.announce(ref_b)
    first = watcher.poll()
    assert [(t.task_key, r) for t, r in first if t is a] == [("ka", refs_a[0]), ("ka", refs_a[1])]
    assert [(t.task_key, r) for t, r in first if t is b] == [("kb", ref_b)]
    assert watcher.poll() == []  # nothing announced twice
    out_a.announce(refs_a[2])
    out_a.finish(3)
    assert watcher.poll() == [(a, refs_a[2])]
    assert a.finished and not b.finished and a.written == 10 + 11 + 12


def test_poll_reads_whole_lines_only(run_dir):
    watcher = StreamWatcher(run_dir)
    task, out = watched(watcher, 1, "k")
    ref = task_block(run_dir, 1, "k", 0)
    line = json.dumps({"block": {**ref.__dict__, "producer": list(ref.producer),
                                 "partitions": list(ref.partitions)}}) + "\n"
    with open(out.path, "a") as f:
        f.write(line[:20])  # a write not yet complete
    assert watcher.poll() == [] and task.offset == 0
    with open(out.path, "a") as f:
        f.write(line[20:])
    assert watcher.poll() == [(task, ref)]


def test_a_lost_block_file_is_still_the_right_block(run_dir):
    """Announced, then lost (an executor's disk): lineage rebuilds it at the same path."""
    watcher = StreamWatcher(run_dir)
    task, out = watched(watcher, 1, "k")
    ref = task_block(run_dir, 1, "k", 0, write=False)
    out.announce(ref)
    assert watcher.poll() == [(task, ref)]


def test_wait_lines_make_a_task_waiting_until_granted(run_dir):
    watcher = StreamWatcher(run_dir)
    up, out_up = watched(watcher, 0, "u", granted=1)
    down, out_down = watched(watcher, 3, "d", granted=0)
    mid, _ = watched(watcher, 1, "m", granted=0)
    out_up.announce(task_block(run_dir, 0, "u", 0))
    with open(out_up.path, "a") as f:  # what OutputStream.wait_for(1) appends before it blocks
        f.write(json.dumps({"wait": 1}) + "\n")
    with open(out_down.path, "a") as f:
        f.write(json.dumps({"wait": 0}) + "\n")
    watcher.poll()
    assert (up.waiting_for, down.waiting_for, mid.waiting_for) == (1, 0, None)
    assert watcher.waiting() == [down, up]  # most downstream first
    watcher.grant(up, 2)
    assert watcher.waiting() == [down]
    out_up.wait_for(1)  # the task side reads the grant and goes on
    assert out_up.granted == 2
    down.yielding = True
    assert watcher.waiting() == []


def test_held_back_follows_tasks_queued_behind_a_waiting_one(run_dir):
    watcher = StreamWatcher(run_dir)
    first, _ = watched(watcher, 1, "a", granted=0)
    second, _ = watched(watcher, 1, "b")
    third, _ = watched(watcher, 1, "c")
    other, _ = watched(watcher, 1, "d")
    second.after, third.after = first.name, second.name
    first.waiting_for = 0
    assert {t.name for t in watcher.held_back(watcher.waiting())} == {first.name, second.name, third.name}
    second.finished = True  # wrote all it had: it holds nothing back, nor anything behind it
    assert {t.name for t in watcher.held_back(watcher.waiting())} == {first.name}
    assert other.name not in {t.name for t in watcher.held_back(watcher.waiting())}


def test_forget_removes_the_stream_and_grant_files(run_dir):
    watcher = StreamWatcher(run_dir)
    task, out = watched(watcher, 1, "k")
    out.finish(0)
    watcher.grant(task, 3)
    assert watcher.forget(task.name) is task
    assert not os.path.exists(out.path) and not os.path.exists(out.grant_path)
    assert task.name not in watcher.tasks


@pytest.mark.parametrize("lie", [
    "block id of another index",
    "block id of another operator",
    "a slice of the file",
    "negative size",
    "rows not an integer",
    "index not an integer",
    "negative index",
    "path of another operator",
    "a missing field",
    "an unknown field",
])
def test_records_that_lie_about_the_block_are_forged(run_dir, lie):
    watcher = StreamWatcher(run_dir)
    task, out = watched(watcher, 1, "k")
    good = task_block(run_dir, 1, "k", 0)
    record = {**good.__dict__, "producer": list(good.producer), "partitions": list(good.partitions)}
    if lie == "block id of another index":
        record["block_id"] = "1:k:1"
    elif lie == "block id of another operator":
        record["block_id"] = "2:k:0"
    elif lie == "a slice of the file":
        record["length"] = 1
    elif lie == "negative size":
        record["size_bytes"] = -5
    elif lie == "rows not an integer":
        record["num_rows"] = "2"
    elif lie == "index not an integer":
        record["producer"] = ["Op1", "k", "0"]
    elif lie == "negative index":
        record["producer"] = ["Op1", "k", -1]
        record["block_id"] = "1:k:-1"
        record["path"] = os.path.join(run_dir, "1-k--1.arrow")
    elif lie == "path of another operator":
        record["path"] = task_block(run_dir, 2, "k", 0).path
    elif lie == "a missing field":
        del record["size_bytes"]
    elif lie == "an unknown field":
        record["delete_after"] = "/etc/passwd"
    with open(out.path, "a") as f:
        f.write(json.dumps({"block": record}) + "\n")
    with pytest.raises(ForgedStreamRecordError, match="task k of operator 1 announced a block"):
        watcher.poll()
    assert os.path.exists(good.path)  # nothing named was touched


def test_the_right_record_after_the_check_passes(run_dir):
    """The control for the forgeries above: the same record, unchanged, is accepted."""
    watcher = StreamWatcher(run_dir)
    task, out = watched(watcher, 1, "k")
    good = task_block(run_dir, 1, "k", 0)
    out.announce(good)
    assert watcher.poll() == [(task, good)]
