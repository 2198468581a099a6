"""The model's idle-slot cut (`operators/map.py`) counts the blocks upstream is about to write.

A slow stateful consumer with one block queued and a second copy idle cuts the block in two
(issue 28). But when the upstream operator still runs a task that has written nothing, or has
a task ready to start (a barrier's next range), a block is on its way for that copy: cutting
then made three tasks of two blocks, the second run whole after the halves (W8 #5: 5.15 s of
inference against 3.47 s). On the in-process backend (`inprocess_backend.py`), about a second
each (the model's sleeps: its copies must still be busy when the second block comes).
"""

from __future__ import annotations

import time

import pytest

import airflow_streambatch.engine as sb
from airflow_streambatch.engine import DataContext
from inprocess_backend import run_in_process

SLOTS = 4  # room for the model's two copies beside an upstream task still running


@pytest.fixture
def ctx(tmp_path):
    context = DataContext(block_dir=str(tmp_path / "blocks"), progress_interval_s=0)
    with context.scoped():
        yield context


class Model:
    """A slow stateful consumer (a class: presumed slow before its first task ends): 10 ms a row,
    so a copy is still busy with a block of 100 rows when the late block comes."""

    def __call__(self, batch):
        time.sleep(0.01 * len(batch["id"]))
        return batch


def _second_block_is_late(batch):
    if batch["id"][0] >= 100:  # the second read task's block comes a moment after the first's
        time.sleep(0.3)
    return batch


def _model_tasks(ds, resources: dict[str, float] | None = None) -> tuple[list[int], int]:
    """The rows the model returned, sorted, and how many tasks it ran."""
    rows, executor = run_in_process(ds, slots=SLOTS, resources=resources)
    return sorted(r["id"] for r in rows), executor.stats.ops[-1].tasks_done


def test_a_block_an_upstream_task_is_about_to_write_is_not_taken_by_a_cut(ctx):
    """Two read tasks, the second still running when the first's block reaches the model: the
    second copy waits for the second block instead of taking half of the first."""
    ds = sb.range(200, override_num_blocks=2).map_batches(_second_block_is_late).map_batches(
        Model, concurrency=2, batch_size=10)
    ids, tasks = _model_tasks(ds)
    assert ids == list(range(200))
    assert tasks == 2, f"the model ran {tasks} tasks for 2 blocks: it cut the first before the second came"


def test_a_barriers_range_ready_to_run_is_a_block_on_its_way(ctx):
    """W8 #5's shape: a repartition into two ranges, then a model of two copies on slots of its
    own. One CPU slot runs the ranges one after the other: when the first's block reaches the
    model, the second range is ready to run and its block is counted as coming, not cut for."""
    ds = sb.range(200, override_num_blocks=1).repartition(2).map_batches(
        Model, concurrency=2, batch_size=10, num_cpus=0, resources={"model": 1})
    ids, tasks = _model_tasks(ds, resources={"CPU": 1, "model": 2})
    assert ids == list(range(200))
    assert tasks == 2, f"the model ran {tasks} tasks for 2 blocks: it cut the first before the second came"


def test_one_block_with_nothing_to_come_is_still_cut_for_every_copy(ctx):
    """Issue 28's case: one block and nothing upstream left to write: both copies get a piece."""
    ds = sb.range(200, override_num_blocks=1).map_batches(Model, concurrency=2, batch_size=10)
    ids, tasks = _model_tasks(ds)
    assert ids == list(range(200))
    assert tasks == 2
