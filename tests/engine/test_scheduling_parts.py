"""The scheduler's parts, one at a time, without Spark: the group sizer, the map
operator's bundling rule and the resource pool (the partition tracker and the stream
watcher are in test_partition_tracker_and_streams.py)."""

from __future__ import annotations

import math
import time

import pytest

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.execution.estimates import Estimates
from airflow_streambatch.engine.execution.operators import build_operators
from airflow_streambatch.engine.execution.operators.map import MapOperator, task_key
from airflow_streambatch.engine.execution.resources import TASK_SLOTS, ResourcePool
from airflow_streambatch.engine.plan.logical import InputBlocks, MapBatches, ResourceRequest
from airflow_streambatch.engine.plan.planner import MapOp, plan
from airflow_streambatch.engine.spark.group_sizer import GroupSizer
from airflow_streambatch.engine.protocol.blocks import BlockRef

# -- GroupSizer ---------------------------------------------------------------------------


def test_group_sizer_ignores_the_first_job():
    sizer = GroupSizer(bound=0.1, max_size=64)
    sizer.observe(wall_s=30.0, partition_work_s=[0.01], tasks=1)  # worker start-up
    assert sizer.job_overhead_s is None
    assert sizer.overhead_per_task_s == pytest.approx(29.99)  # still reported


def test_group_sizer_depth_is_one_until_a_check_in_is_measured():
    """A job's start is paid once for many groups: sizing groups by it put five 2 s tasks into
    each partition of W6's first jobs on a cluster, and a killed executor lost all five."""
    sizer = GroupSizer(bound=0.1, max_size=64)
    sizer.observe(5.0, [0.1], 1)
    sizer.observe(wall_s=1.0, partition_work_s=[0.0], tasks=1)  # a second of job overhead
    assert sizer.job_overhead_s == pytest.approx(1.0)
    assert sizer.depth(task_s=0.01, ready=1000, slots=1) == 1


def test_group_sizer_depth_amortizes_a_check_in():
    sizer = GroupSizer(bound=0.1, max_size=64)
    sizer.observe_check_in(0.02)
    assert sizer.depth(task_s=0.01, ready=1000, slots=1) == math.ceil(0.02 / (0.1 * 0.01)) == 20
    assert sizer.depth(task_s=0.015, ready=1000, slots=1) == math.ceil(0.02 / (0.1 * 0.015)) == 14
    assert sizer.depth(task_s=2.0, ready=1000, slots=1) == 1  # seconds-long tasks: full pipelining
    sizer.observe_check_in(0.12)  # moving average: 0.7 * 0.02 + 0.3 * 0.12
    assert sizer.check_in_overhead_s == pytest.approx(0.05)
    assert sizer.depth(task_s=0.01, ready=1000, slots=1) == 50
    sizer.observe_check_in(-0.01)  # work measured longer than the round trip: no overhead, never negative
    assert sizer.check_in_overhead_s == pytest.approx(0.035)


def test_group_sizer_depth_is_capped_by_max_size_and_ready_tasks_per_slot():
    sizer = GroupSizer(bound=0.1, max_size=8)
    sizer.observe_check_in(1.0)
    assert sizer.depth(task_s=0.01, ready=1000, slots=1) == 8
    assert sizer.depth(task_s=0.01, ready=10, slots=4) == 3  # ceil(10 / 4)
    assert sizer.depth(task_s=0.01, ready=4, slots=4) == 1
    assert sizer.depth(task_s=0.01, ready=0, slots=0) == 1
    assert sizer.depth(task_s=0.0, ready=1000, slots=1) == 1  # no timing yet


def test_group_sizer_work_longer_than_wall_is_no_overhead():
    sizer = GroupSizer(bound=0.1, max_size=64)
    sizer.observe(1.0, [0.5], 1)
    sizer.observe(1.0, [3.0], 1)
    assert sizer.job_overhead_s == 0.0


def test_group_sizer_disabled_always_runs_one_task_per_partition():
    sizer = GroupSizer(bound=0.1, max_size=64, enabled=False)
    for _ in range(3):
        sizer.observe(10.0, [0.001], 1)
        sizer.observe_check_in(1.0)
    assert sizer.depth(task_s=0.001, ready=1000, slots=1) == 1


# -- MapOperator bundling -----------------------------------------------------------------


def _identity(batch):
    return batch


def map_operator(tmp_path, cpus=1, batch_size=None, min_size=100, max_size=1000, cheap=True) -> MapOperator:
    """A map operator; with ``cheap`` it has seen one task of 1 ms over 10 rows that kept its
    input's size, so small blocks are cheap to bundle."""
    ctx = DataContext(block_dir=str(tmp_path / "blocks"), target_min_block_size=min_size,
                      target_max_block_size=max_size, resources={"CPU": cpus}, progress_interval_s=0)
    transform = MapBatches(name="MapBatches(_identity)", compute=ResourceRequest.make("m", num_cpus=1),
                           fn=_identity, batch_size=batch_size)
    physical = plan([InputBlocks(blocks=()), transform])
    assert isinstance(physical[1], MapOp)
    operators = build_operators(physical, ctx, ResourcePool({"CPU": cpus}))
    op = operators[1]
    assert isinstance(op, MapOperator)
    if cheap:
        op.estimates = Estimates(tasks=1, work_s=0.001, input_bytes=10, output_bytes=10, input_rows=10)
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
    assert list(spec.inputs) == refs[:4] and spec.partitions == (0,) and spec.task_key == task_key(refs[:4])
    assert list(op.inputs) == refs[4:]
    assert list(op.next_task().inputs) == refs[4:8]
    assert op._peek_bundle() == refs[8:]  # what is left, though under the target


def test_a_block_at_the_target_runs_alone(tmp_path):
    op = map_operator(tmp_path, min_size=100)
    refs = queue(op, blocks(3, size=100))
    assert list(op.next_task().inputs) == refs[:1]


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
    assert list(op.next_task().inputs) == refs[:2]
    spec = op.next_task()
    assert list(spec.inputs) == refs[2:4] and spec.partitions == (1,)


def test_bundles_mix_partitions_only_when_allowed(tmp_path):
    op = map_operator(tmp_path, min_size=1000)
    op.mix_partitions = True
    refs = queue(op, blocks(6, size=10, partition=lambda i: i // 2))
    spec = op.next_task()
    assert list(spec.inputs) == refs and spec.partitions == (0, 1, 2)


def test_batch_size_sets_the_least_rows_of_a_bundle(tmp_path):
    op = map_operator(tmp_path, batch_size=25, min_size=1)  # any block is big enough in bytes
    refs = queue(op, blocks(7, size=10, rows=10))
    assert op.min_rows == 25
    assert list(op.next_task().inputs) == refs[:3]  # 30 rows >= 25
    assert list(op.next_task().inputs) == refs[3:6]


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
    assert list(op.next_task().inputs) == list(blocks(1, size=30, rows=10))


def test_a_bundle_under_target_min_size_starts_when_it_holds_all_queued_blocks(tmp_path):
    """Bundling saves per-task overhead only with a backlog: a free slot never waits for
    more input to reach target_min_block_size (only batch_size makes a bundle wait)."""
    op = map_operator(tmp_path, min_size=100)
    refs = queue(op, blocks(2, size=30))
    assert op.has_input() and op._peek_bundle() == refs
    op.cut = True  # upstream of a satisfied limit: nothing launches
    assert not op.has_input()


# -- sizing by cost (issue 16): fake estimates, the rule alone -------------------------------


def test_before_any_task_finished_each_block_runs_alone(tmp_path):
    op = map_operator(tmp_path, min_size=1000, cheap=False)
    refs = queue(op, blocks(6, size=10))
    assert list(op.next_task().inputs) == refs[:1]
    assert op.has_input()  # a lone block is ready at once


def test_tiny_expanding_blocks_run_one_per_task(tmp_path):
    """The W1-shaped failure: 8-byte rows, each taking 2 s and growing to 40 MiB, were
    coalesced by input bytes into a few tasks that ran serially on a few slots."""
    op = map_operator(tmp_path, cpus=2, min_size=1 << 20, max_size=128 << 20, cheap=False)
    op.estimates = Estimates(tasks=1, work_s=2.0, input_bytes=8, output_bytes=40 << 20, input_rows=1)
    refs = queue(op, blocks(40, size=8, rows=1))
    assert [len(op.next_task().inputs) for _ in range(3)] == [1, 1, 1]
    assert list(op.inputs) == refs[3:]


def test_a_block_whose_output_fills_a_block_runs_alone_even_when_fast(tmp_path):
    op = map_operator(tmp_path, min_size=1 << 20, max_size=1 << 20, cheap=False)
    op.estimates = Estimates(tasks=1, work_s=0.001, input_bytes=8, output_bytes=1 << 20, input_rows=1)
    queue(op, blocks(10, size=8, rows=1))
    assert len(op.next_task().inputs) == 1


def test_tiny_cheap_blocks_are_bundled_up_to_one_job_overhead_of_work(tmp_path):
    op = map_operator(tmp_path, min_size=1 << 20, cheap=False)
    op.estimates = Estimates(tasks=1, work_s=0.01, input_bytes=8, output_bytes=8, input_rows=1)  # 10 ms a row
    queue(op, blocks(100, size=8, rows=1))
    assert len(op.next_task().inputs) == 10  # 100 ms: the default job overhead
    op.sizer.job_overhead_s = 0.05  # measured
    assert len(op.next_task().inputs) == 5


def test_an_expensive_block_never_joins_a_cheap_bundle(tmp_path):
    op = map_operator(tmp_path, min_size=1 << 20, cheap=False)
    op.estimates = Estimates(tasks=2, work_s=0.02, input_bytes=16, output_bytes=16, input_rows=2)
    refs = queue(op, blocks(2, size=8, rows=1) + blocks(1, size=8, rows=1000, start=2))
    assert list(op.next_task().inputs) == refs[:2]  # the 1000-row block would take 10 s
    assert list(op.next_task().inputs) == refs[2:]


def test_cost_follows_rows_or_bytes_whichever_predicts_more(tmp_path):
    est = Estimates(tasks=1, work_s=1.0, input_bytes=100, output_bytes=1000, input_rows=10)
    assert est.for_input(rows=20, nbytes=100) == (2.0, 2000.0)  # rows predict more
    assert est.for_input(rows=10, nbytes=300) == (3.0, 3000.0)  # bytes predict more


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


# -- the threads that submit Spark jobs ----------------------------------------------------


def test_job_threads_are_reused_and_exit_when_closed():
    """A thread per job opened a Py4J connection and a JVM thread per job; the run's jobs now
    share threads, at most as many as ran at once."""
    import threading

    from airflow_streambatch.engine.spark.backend import _JobThreads

    threads = _JobThreads("test-run")
    release, done = threading.Event(), []
    started = threading.Semaphore(0)

    def job(i):
        started.release()
        release.wait(10)
        done.append((i, threading.current_thread().name))

    for i in range(3):
        threads.submit(job, i)
    for _ in range(3):
        assert started.acquire(timeout=10)
    release.set()
    deadline = time.monotonic() + 10
    while len(done) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(3, 6):  # three more, one after another: the idle threads take them
        threads.submit(job, i)
        assert started.acquire(timeout=10)
    while len(done) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    names = {name for _, name in done}
    assert sorted(i for i, _ in done) == list(range(6)) and len(names) == 3
    threads.close()
    deadline = time.monotonic() + 10
    while any(t.name in names for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name in names for t in threading.enumerate())
