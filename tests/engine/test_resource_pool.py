"""`ResourcePool`: GPU ids for fractional requests, resources the pool does not have, and
clusters (where Spark, not the pool, assigns GPU ids)."""

from __future__ import annotations

from airflow_streambatch.engine.execution.resources import ResourcePool
from airflow_streambatch.engine.plan.logical import ResourceRequest


def req(**kw) -> ResourceRequest:
    return ResourceRequest.make("op", **kw)


def test_four_quarter_gpu_tasks_share_one_gpu_then_the_next_takes_another():
    pool = ResourcePool({"GPU": 2})
    quarter = req(num_gpus=0.25)
    assert [pool.acquire(1, quarter) for _ in range(4)] == [("0",)] * 4
    assert pool.acquire(1, quarter) == ("1",)
    assert pool.slots_for(1, quarter) == 3


def test_a_released_share_is_handed_out_again():
    pool = ResourcePool({"GPU": 1})
    half = req(num_gpus=0.5)
    first, second = pool.acquire(1, half), pool.acquire(1, half)
    assert first == second == ("0",)
    assert pool.slots_for(1, half) == 0
    pool.release(1, half, first)
    assert pool.slots_for(1, half) == 1
    assert pool.acquire(1, half) == ("0",)


def test_shares_fill_one_gpu_and_leave_whole_ones_for_whole_gpu_tasks():
    pool = ResourcePool({"GPU": 2})
    pool.acquire(1, req(num_gpus=0.5))
    assert pool.acquire(2, req(num_gpus=1)) == ("1",)  # the untouched GPU
    assert pool.acquire(1, req(num_gpus=0.5)) == ("0",)  # the half-used one, not a new one


def test_multi_gpu_tasks_get_distinct_whole_gpus():
    pool = ResourcePool({"GPU": 4})
    two = req(num_gpus=2)
    a, b = pool.acquire(1, two), pool.acquire(1, two)
    assert len(set(a + b)) == 4
    pool.release(1, two, a)
    assert sorted(pool.acquire(1, two)) == sorted(a)


def test_a_resource_missing_from_the_totals_fits_no_task_and_raises_nothing():
    pool = ResourcePool({"CPU": 4})
    tpu = req(resources={"tpu": 1})
    assert pool.slots_for(1, tpu) == 0
    assert pool.slots_for(1, tpu, keep={"tpu": 1}) == 0
    assert pool.capacity_for(tpu) == 0
    pool.acquire(1, tpu)  # the pool's own bookkeeping may not fail either
    pool.release(1, tpu, ())


def test_on_a_cluster_the_pool_counts_gpu_slots_but_hands_out_no_ids():
    pool = ResourcePool({"CPU": 4, "GPU": 2}, assign_gpus=False)
    gpu = req(num_gpus=1)
    assert pool.acquire(1, gpu) == () and pool.acquire(1, gpu) == ()
    assert pool.slots_for(1, gpu) == 0  # both GPU slots are taken
    pool.release(1, gpu, ())
    assert pool.slots_for(1, gpu) == 1
