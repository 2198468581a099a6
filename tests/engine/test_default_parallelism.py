"""With the defaults a user has, every slot gets work (issue 28): a read is a task per file
(up to 200), a file alone is cut into two tasks per slot where it has the pieces, and a block that would keep a slow
consumer's other copies idle is cut into one piece per idle slot."""

from __future__ import annotations

import os
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

import airflow_streambatch.engine as sb
from conftest import SPARK_SLOTS


def _files(root, count: int, rows: int) -> str:
    os.makedirs(root)
    for f in range(count):
        pq.write_table(pa.table({"id": list(range(f * rows, (f + 1) * rows))}), f"{root}/f{f:02d}.parquet")
    return str(root)


def _read_tasks(ds) -> int:
    return ds.last_run_stats.ops[0].tasks_done


class Model:
    """A slow stateful consumer: each copy tags the rows it handled with its own id."""

    def __init__(self):
        self.copy = uuid.uuid4().hex

    def __call__(self, batch: pa.Table) -> pa.Table:
        time.sleep(0.2)
        return batch.append_column("copy", pa.array([self.copy] * batch.num_rows))


def test_whole_files_are_read_by_a_task_each_up_to_200(ctx, tmp_path):
    """16 files of a few hundred bytes: a task each (as Ray Data's 200-block floor gives), not two
    per slot (W7's 48 files of loads were 12 tasks of four) nor one for the whole (1 MiB) floor."""
    ds = sb.read_parquet(_files(tmp_path / "in", 16, 10))
    assert sorted(r["id"] for r in ds.take_all()) == list(range(160))
    assert _read_tasks(ds) == 16


def test_a_small_file_is_cut_into_two_tasks_per_slot(ctx, tmp_path):
    """One file of many row groups is cut at row groups into two tasks per slot, not 200."""
    path = tmp_path / "one.parquet"
    pq.write_table(pa.table({"id": list(range(400))}), str(path), row_group_size=10)
    ds = sb.read_parquet(str(path))
    assert sorted(r["id"] for r in ds.take_all()) == list(range(400))
    assert _read_tasks(ds) == 2 * SPARK_SLOTS


def test_reads_are_never_cut_finer_than_the_files(ctx, tmp_path):
    ds = sb.read_parquet(_files(tmp_path / "in", 3, 10))
    assert len(ds.take_all()) == 30 and _read_tasks(ds) == 3


def test_rows_of_range_and_from_items_are_units_of_work(ctx):
    """48 rows of ``range`` are 48 read tasks, as W1's 48 one-second loads need (two per slot
    made them 8 tasks of six); past 200 rows, 200 tasks."""
    for ds, rows, tasks in ((sb.range(48), 48, 48), (sb.from_items(list(range(30))), 30, 30),
                            (sb.range(1000), 1000, 200)):
        assert ds.materialize().count() == rows  # a run: count() alone knows the rows without one
        assert _read_tasks(ds) == tasks


def test_one_block_feeds_every_copy_of_a_slow_stateful_consumer(ctx, tmp_path):
    """One small file is one block; the model's copies share it instead of one copy taking it all
    while the others idle. Every row is written once, by the one partition that read it."""
    ds = sb.read_parquet(_files(tmp_path / "in", 1, 400)).map_batches(
        Model, concurrency=SPARK_SLOTS, batch_size=50, batch_format="pyarrow")
    result = ds.write_parquet(str(tmp_path / "out"))
    assert list(result.committed) == [0]
    table = pq.read_table(str(tmp_path / "out"))
    assert sorted(table["id"].to_pylist()) == list(range(400))
    assert len(set(table["copy"].to_pylist())) == SPARK_SLOTS
    model = ds.last_run_stats.ops[1]
    assert model.tasks_done == SPARK_SLOTS


def test_pieces_are_never_smaller_than_the_batch_size(ctx, tmp_path):
    ds = sb.read_parquet(_files(tmp_path / "in", 1, 300)).map_batches(
        Model, concurrency=SPARK_SLOTS, batch_size=150, batch_format="pyarrow")
    rows = ds.take_all()
    assert sorted(r["id"] for r in rows) == list(range(300))
    assert ds.last_run_stats.ops[1].tasks_done == 2


def test_with_preserve_order_a_block_is_not_cut(ctx, tmp_path):
    """Pieces of one block would share its place in the order: ordered runs keep blocks whole."""
    ctx.execution_options.preserve_order = True
    ds = sb.read_parquet(_files(tmp_path / "in", 1, 200)).map_batches(
        Model, concurrency=SPARK_SLOTS, batch_size=50, batch_format="pyarrow")
    assert [r["id"] for r in ds.take_all()] == list(range(200))
    assert ds.last_run_stats.ops[1].tasks_done == 1
