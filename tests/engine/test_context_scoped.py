"""`DataContext.scoped`: a context is current for a block, and the previous one comes back after it
(no Spark needed)."""

from __future__ import annotations

import pytest

from airflow_streambatch.engine.context import DataContext


def test_scoped_installs_a_context_and_restores_the_previous_one():
    outer = DataContext.get_current()
    mine = DataContext(progress_interval_s=0)
    with mine.scoped() as ctx:
        assert ctx is mine and DataContext.get_current() is mine
        with DataContext.get_current().scoped(memory_limit=123 << 20) as inner:
            assert DataContext.get_current() is inner and inner is not mine
            assert inner.memory_limit == 123 << 20 and inner.progress_interval_s == 0
            assert mine.memory_limit != 123 << 20  # overrides go to a copy
        assert DataContext.get_current() is mine
    assert DataContext.get_current() is outer


def test_scoped_restores_the_previous_context_when_the_block_raises():
    outer = DataContext.get_current()
    with pytest.raises(RuntimeError, match="boom"), DataContext(max_task_retries=0).scoped():
        assert DataContext.get_current().max_task_retries == 0
        raise RuntimeError("boom")
    assert DataContext.get_current() is outer


def test_scoped_overrides_are_checked_before_anything_changes():
    outer = DataContext.get_current()
    with pytest.raises(ValueError, match="DataContext.max_group_size must be a positive integer, got 0"):
        with outer.scoped(max_group_size=0):
            pass
    assert DataContext.get_current() is outer
