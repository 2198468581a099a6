"""Planner: fusion only across equal resource requests, and initial read partitioning."""

from __future__ import annotations

import airflow_streambatch.engine as sb
from airflow_streambatch.engine.plan.datasource import Fragment, group_fragments, partition_count
from airflow_streambatch.engine.plan.planner import plan

MiB = 1 << 20


def _names(ds, fuse=True):
    return [op.name for op in plan(list(ds._logical), fuse)]


def test_equal_cpu_operators_fuse_into_the_read():
    ds = sb.range(10).map(lambda r: r).map_batches(lambda b: b).filter(lambda r: True)
    assert _names(ds) == ["ReadRange->Map(<lambda>)->MapBatches(<lambda>)->Filter(<lambda>)"]


def test_cpu_to_gpu_boundary_never_fuses():
    def embed(b):
        return b

    ds = sb.range(10).map_batches(lambda b: b).map_batches(embed, num_gpus=1).map_batches(lambda b: b)
    assert _names(ds) == ["ReadRange->MapBatches(<lambda>)", "MapBatches(embed)", "MapBatches(<lambda>)"]


def test_different_cpu_amounts_or_concurrency_do_not_fuse():
    ds = sb.range(10).map_batches(lambda b: b, num_cpus=2).map_batches(lambda b: b, num_cpus=2, concurrency=1)
    assert len(_names(ds)) == 3


def test_custom_resources_split_operators():
    ds = sb.range(10).map_batches(lambda b: b, resources={"tpu": 1})
    assert len(_names(ds)) == 2


def test_fusion_can_be_disabled():
    ds = sb.range(10).map(lambda r: r).map(lambda r: r)
    assert len(_names(ds, fuse=False)) == 3


def test_limits_merge_and_repartition_is_its_own_operator():
    ds = sb.range(10).limit(5).limit(3).repartition(2)
    ops = plan(list(ds._logical))
    assert [type(op).__name__ for op in ops] == ["ReadOp", "LimitOp", "RepartitionOp"] and ops[1].limit == 3


def test_partition_count_is_two_per_slot_and_at_most_the_target_each():
    assert partition_count(1000 * MiB, 10_000, 8, None, 128 * MiB) == 16  # two per slot
    assert partition_count(4000 * MiB, 10_000, 8, None, 128 * MiB) == 32  # 128 MiB cap
    assert partition_count(1 * MiB, 10_000, 2, None, 128 * MiB) == 4  # small inputs fill the slots too
    assert partition_count(4000 * MiB, 5, 8, None, 128 * MiB) == 5  # no more than fragments
    assert partition_count(10, 100, 8, 7, 128 * MiB) == 7  # user override


def test_group_fragments_of_nearly_equal_files_are_even():
    frags = [Fragment(f"f{i}", size) for i, size in enumerate([990] + [1000] * 6 + [1010])]
    assert [len(g) for g in group_fragments(frags, 4)] == [2, 2, 2, 2]


def test_group_fragments_never_leaves_a_group_empty():
    frags = [Fragment("huge", 1000)] + [Fragment(f"f{i}", 1) for i in range(3)]
    assert [len(g) for g in group_fragments(frags, 4)] == [1, 1, 1, 1]
    assert [len(g) for g in group_fragments([Fragment(f"e{i}", 0) for i in range(4)], 2)] == [2, 2]


def test_group_fragments_balances_bytes_and_keeps_order():
    frags = [Fragment(f"f{i}", size) for i, size in enumerate([10, 10, 10, 10, 40, 40])]
    groups = group_fragments(frags, 3)
    assert len(groups) == 3
    assert [f.path for g in groups for f in g] == [f"f{i}" for i in range(6)]
    assert [sum(f.size for f in g) for g in groups] == [40, 40, 40]
