"""Scheduling policies, decision by decision, against fake operators (no Spark, no executor).

Like Ray Data's policy tests: each fake operator states exactly what the policy reads
through `OpView` (input, running tasks, estimates, buffered output), and each test
checks one decision. Algorithm 2's replenishment is covered in test_scheduler.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from airflow_streambatch.engine.execution.estimates import Estimates
from airflow_streambatch.engine.execution.memory import MemoryBudget
from airflow_streambatch.engine.execution.policies import (
    AdaptivePolicy,
    ConservativePolicy,
    OpView,
    SchedulingPolicy,
    make_policy,
)

MiB = 1 << 20


@dataclass
class FakeOp:
    """An `OpView` whose answers are set by the test."""

    index: int
    is_source: bool = False
    buffered_output_bytes: int = 0
    out_estimate: float = 0.0  # mean estimate of the next task's output
    pessimistic_estimate: float | None = None  # largest seen; defaults to the mean
    input_bytes: int = 0
    running_tasks: int = 0
    is_probing: bool = False
    slots: int = 1
    queued: bool = True
    estimates: Estimates = field(default_factory=Estimates)
    asked: list = field(default_factory=list)  # pessimistic flags the policy asked with

    @property
    def probing(self) -> bool:
        return self.is_probing

    def has_input(self) -> bool:
        return self.queued

    def running(self) -> int:
        return self.running_tasks

    def next_task_output_estimate(self, pessimistic: bool = False) -> float:
        self.asked.append(pessimistic)
        if pessimistic and self.pessimistic_estimate is not None:
            return self.pessimistic_estimate
        return self.out_estimate

    def next_task_input_bytes(self) -> int:
        return self.input_bytes

    def usable_slots(self) -> int:
        return self.slots


def source(**kw) -> FakeOp:
    return FakeOp(index=0, is_source=True, **kw)


def memory(limit=100 * MiB, used=0, reserved=0.0) -> MemoryBudget:
    return MemoryBudget(limit=limit, used=used, reserved=reserved)


def test_the_fake_implements_the_protocols():
    """The fakes stand for real operators only while they match `OpView`'s members."""
    view_members = {name for name in OpView.__annotations__} | {
        name for name in vars(OpView) if not name.startswith("_")}
    assert view_members <= set(dir(FakeOp(0)))
    for policy in (AdaptivePolicy(memory()), ConservativePolicy(memory())):
        for name in vars(SchedulingPolicy):
            if not name.startswith("_"):
                assert callable(getattr(policy, name)), (type(policy).__name__, name)


# -- AdaptivePolicy: sources ----------------------------------------------------------

def test_adaptive_budget_starts_at_the_memory_limit():
    policy = AdaptivePolicy(memory(limit=40 * MiB))
    assert policy.budget == 40 * MiB
    assert policy.may_launch(source(out_estimate=40 * MiB))
    policy.on_launch(source(), 1)
    assert not policy.may_launch(source(out_estimate=40 * MiB))


def test_adaptive_source_launches_only_within_its_budget():
    policy = AdaptivePolicy(memory(limit=100 * MiB))
    policy.budget = 10 * MiB
    assert policy.may_launch(source(out_estimate=10 * MiB))
    assert not policy.may_launch(source(out_estimate=10 * MiB + 1))
    policy.budget = 0
    assert not policy.may_launch(source(out_estimate=1))


def test_adaptive_source_larger_than_the_limit_needs_only_a_full_budget():
    """A partition estimated above the whole limit could never launch otherwise."""
    policy = AdaptivePolicy(memory(limit=10 * MiB))
    assert policy.may_launch(source(out_estimate=50 * MiB))  # budget == limit: it runs, alone
    policy.budget = 10 * MiB - 1
    assert not policy.may_launch(source(out_estimate=50 * MiB))


@pytest.mark.parametrize("used, reserved", [(100 * MiB, 0), (60 * MiB, 40 * MiB), (0, 100 * MiB), (120 * MiB, 0)])
def test_adaptive_source_waits_while_memory_is_full(used, reserved):
    policy = AdaptivePolicy(memory(limit=100 * MiB, used=used, reserved=reserved))
    policy.budget = 100 * MiB  # budget to spare: memory alone stops it
    assert not policy.may_launch(source(out_estimate=1))


def test_adaptive_source_may_start_while_any_memory_is_free():
    """Sources check only that memory is not full (the budget paces them), not that their
    estimate fits: that is Adaptive's documented overshoot."""
    policy = AdaptivePolicy(memory(limit=100 * MiB, used=99 * MiB))
    assert policy.may_launch(source(out_estimate=50 * MiB))


def test_adaptive_on_launch_spends_the_source_budget_only():
    policy = AdaptivePolicy(memory(limit=100 * MiB))
    policy.on_launch(source(), 30 * MiB)
    assert policy.budget == 70 * MiB
    policy.on_launch(FakeOp(index=1), 30 * MiB)  # a non-source does not spend it
    assert policy.budget == 70 * MiB
    op = source(out_estimate=40 * MiB)
    assert policy.may_launch(op)
    policy.on_launch(op, 40 * MiB)
    assert policy.budget == 30 * MiB
    assert not policy.may_launch(op)  # the next 40 MiB partition must wait for replenishment


# -- AdaptivePolicy: non-sources ------------------------------------------------------

def test_adaptive_non_source_that_shrinks_memory_always_runs():
    policy = AdaptivePolicy(memory(limit=10 * MiB, used=50 * MiB, reserved=5 * MiB))
    op = FakeOp(index=1, buffered_output_bytes=8 * MiB, input_bytes=4 * MiB, out_estimate=1 * MiB)
    assert policy.may_launch(op)
    op.out_estimate = 4 * MiB  # writes as much as it frees: no growth
    assert policy.may_launch(op)


def test_adaptive_non_source_growth_must_fit_in_memory():
    policy = AdaptivePolicy(memory(limit=100 * MiB, used=60 * MiB, reserved=20 * MiB))
    op = FakeOp(index=1, buffered_output_bytes=1, input_bytes=10 * MiB, out_estimate=30 * MiB)  # grows 20 MiB
    assert policy.may_launch(op)  # 60 + 20 + 20 == 100: exactly fits
    op.out_estimate += 1
    assert not policy.may_launch(op)
    policy.memory.reserved -= 1
    assert policy.may_launch(op)


def test_adaptive_non_source_with_nothing_buffered_may_run_even_if_it_grows():
    """With none of its output waiting downstream, it must run for the pipeline to progress."""
    policy = AdaptivePolicy(memory(limit=10 * MiB, used=10 * MiB))
    op = FakeOp(index=2, buffered_output_bytes=0, input_bytes=1 * MiB, out_estimate=100 * MiB)
    assert policy.may_launch(op)
    op.buffered_output_bytes = 1
    assert not policy.may_launch(op)


def test_adaptive_non_source_ignores_the_source_budget():
    policy = AdaptivePolicy(memory(limit=100 * MiB))
    policy.budget = 0
    assert policy.may_launch(FakeOp(index=1, buffered_output_bytes=5, input_bytes=1, out_estimate=2))


def test_adaptive_reservation_is_the_mean_estimate_capped_by_the_room():
    policy = AdaptivePolicy(memory(limit=100 * MiB, used=50 * MiB, reserved=20 * MiB))
    op = FakeOp(index=1, out_estimate=10 * MiB, pessimistic_estimate=80 * MiB)
    assert policy.reservation(op) == 10 * MiB
    assert op.asked == [False]  # the mean, not the largest seen
    op.out_estimate = 31 * MiB
    assert policy.reservation(op) == 30 * MiB == policy.memory.room()
    policy.memory.used = 150 * MiB  # over the limit: nothing is free
    assert policy.reservation(op) == 0


@pytest.mark.parametrize("buffered, expected", [
    ([5, 3, 9], 1),  # least buffered output
    ([0, 0, 0], 2),  # ties: the most downstream
    ([4, 1, 1], 2),
    ([1, 1, 4], 1),
])
def test_adaptive_pick_least_buffered_then_downstream(buffered, expected):
    ops = [FakeOp(index=i, is_source=i == 0, buffered_output_bytes=b) for i, b in enumerate(buffered)]
    assert AdaptivePolicy.pick(ops).index == expected
    assert AdaptivePolicy.pick(list(reversed(ops))).index == expected  # order of candidates does not matter


def test_adaptive_pick_of_nothing_is_none():
    assert AdaptivePolicy(memory()).pick([]) is None


# -- ConservativePolicy -----------------------------------------------------------------

def test_conservative_idle_operator_may_always_start_one_task():
    policy = ConservativePolicy(memory(limit=10 * MiB, used=50 * MiB, reserved=10 * MiB))
    for op in (source(out_estimate=1 << 40, is_probing=True),
               FakeOp(index=1, out_estimate=1 << 40, input_bytes=1, buffered_output_bytes=1 << 30)):
        assert policy.may_launch(op)
        op.running_tasks = 1
        assert not policy.may_launch(op)


def test_conservative_probe_runs_alone():
    policy = ConservativePolicy(memory(limit=100 * MiB))  # all memory free
    op = FakeOp(index=1, running_tasks=1, is_probing=True, out_estimate=1, input_bytes=10)  # would even shrink
    assert not policy.may_launch(op)
    op.is_probing = False
    assert policy.may_launch(op)


def test_conservative_shrinking_operator_may_always_run():
    policy = ConservativePolicy(memory(limit=10 * MiB, used=30 * MiB, reserved=5 * MiB))
    op = FakeOp(index=1, running_tasks=3, out_estimate=0, pessimistic_estimate=4 * MiB, input_bytes=4 * MiB)
    assert policy.may_launch(op)
    op.pessimistic_estimate = 4 * MiB + 1  # the largest ratio seen grows: it must fit now
    assert not policy.may_launch(op)


def test_conservative_launch_fits_the_pessimistic_estimate():
    policy = ConservativePolicy(memory(limit=100 * MiB, used=50 * MiB, reserved=30 * MiB))
    op = FakeOp(index=1, running_tasks=1, out_estimate=1 * MiB, pessimistic_estimate=20 * MiB, input_bytes=1)
    assert policy.may_launch(op)  # 50 + 30 + 20 == 100
    assert op.asked[-1] is True
    op.pessimistic_estimate += 1
    assert not policy.may_launch(op)  # even though the mean (1 MiB) fits easily


def test_conservative_probe_reserves_all_the_room():
    policy = ConservativePolicy(memory(limit=100 * MiB, used=30 * MiB, reserved=10 * MiB))
    probe = FakeOp(index=1, is_probing=True, out_estimate=1, pessimistic_estimate=1)
    assert policy.reservation(probe) == 60 * MiB
    policy.memory.used = 200 * MiB
    assert policy.reservation(probe) == 0


def test_conservative_reservation_is_the_largest_seen_capped_by_the_room():
    policy = ConservativePolicy(memory(limit=100 * MiB, used=30 * MiB, reserved=10 * MiB))
    op = FakeOp(index=1, out_estimate=1 * MiB, pessimistic_estimate=5 * MiB)
    assert policy.reservation(op) == 5 * MiB
    op.pessimistic_estimate = 500 * MiB
    assert policy.reservation(op) == 60 * MiB


def test_conservative_has_no_source_budget():
    policy = ConservativePolicy(memory(limit=100 * MiB))
    op = source(running_tasks=1, out_estimate=10 * MiB, input_bytes=0)
    for _ in range(20):
        policy.replenish([op], 1.0)
        policy.on_launch(op, 10 * MiB)
    assert policy.may_launch(op)  # only memory limits it
    policy.memory.used = 91 * MiB
    assert not policy.may_launch(op)


@pytest.mark.parametrize("buffered", [[0, 0, 0], [0, 0, 100], [100, 0, 0]])
def test_conservative_pick_is_downstream_first_whatever_is_buffered(buffered):
    ops = [FakeOp(index=i, buffered_output_bytes=b) for i, b in enumerate(buffered)]
    assert ConservativePolicy.pick(ops).index == 2
    assert ConservativePolicy.pick(list(reversed(ops))).index == 2
    assert ConservativePolicy.pick(ops[:2]).index == 1
    assert ConservativePolicy.pick([]) is None


# -- make_policy ------------------------------------------------------------------------

def test_make_policy_by_name_shares_the_memory_budget():
    budget = memory(limit=7 * MiB)
    adaptive = make_policy("adaptive", budget)
    conservative = make_policy("conservative", budget)
    assert type(adaptive) is AdaptivePolicy and type(conservative) is ConservativePolicy
    assert adaptive.memory is budget and conservative.memory is budget
    assert adaptive.budget == 7 * MiB
