"""A dataset built on a materialized one keeps its blocks alive (issue 17, item 10).

Ray Data's ``materialize()`` returns a dataset whose blocks live while anything can still
read them: ``ds.materialize().limit(7).take_all()`` works though nothing names the
materialized dataset. Here its block files are deleted only once neither it nor a dataset
built on it is referenced.
"""

from __future__ import annotations

import gc
import os

import airflow_streambatch.engine as rd


def test_an_unreferenced_materialized_dataset_lives_while_a_dataset_built_on_it_does(ctx):
    rows = rd.range(10, override_num_blocks=5).materialize().limit(7).take_all()
    assert len(rows) == 7 and len({r["id"] for r in rows}) == 7 and all(0 <= r["id"] < 10 for r in rows)

    shifted = rd.range(10, override_num_blocks=5).materialize().map(lambda r: {"id": r["id"] + 1})
    gc.collect()
    assert sorted(r["id"] for r in shifted.take_all()) == list(range(1, 11))
    assert sorted(r["id"] for r in shifted.take_all()) == list(range(1, 11))  # read twice, nothing recomputed


def test_the_blocks_go_when_the_last_dataset_that_reads_them_goes(ctx):
    block_dir = ctx.block_dir
    before = _block_files(block_dir)
    derived = rd.range(10, override_num_blocks=5).materialize().limit(3)
    gc.collect()
    assert len(_block_files(block_dir) - before) == 5  # kept for `derived`
    del derived
    gc.collect()
    assert _block_files(block_dir) - before == set()


def test_a_materialized_limit_keeps_the_blocks_it_sliced(ctx):
    """``limit`` slices block references without a task, so the blocks of ``x.limit(3).materialize()``
    are ``x``'s files: they live while it does, after ``x`` is gone, and go with it."""
    block_dir = ctx.block_dir
    before = _block_files(block_dir)
    first = rd.range(10, override_num_blocks=5).materialize()
    head = first.limit(3).materialize()
    del first
    gc.collect()
    assert sorted(r["id"] for r in head.take_all()) == [0, 1, 2]
    del head
    gc.collect()
    assert _block_files(block_dir) - before == set()


def _block_files(root) -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith(".arrow")}


def _tag(batch):
    return {"id": batch["id"], "tag": batch["id"] % 7}


def test_a_materialized_block_of_several_partitions_is_written_once(ctx, tmp_path):
    """A model's task of the materializing run took the small blocks of four read tasks (nothing
    was committed there, so it may): its one block descends from all four partitions. A write of
    the materialized dataset once failed on it ("too many values to unpack": a sink task writes one
    partition); it is one partition of the write."""
    import pyarrow.parquet as pq

    done = rd.range(40, override_num_blocks=4).map_batches(_tag, batch_size=40, concurrency=1).materialize()
    assert any(len(ref.partitions) > 1 for ref in done._refs), [ref.partitions for ref in done._refs]
    done.write_parquet(str(tmp_path / "out"))
    written = pq.read_table(str(tmp_path / "out")).column("id").to_pylist()
    assert sorted(written) == list(range(40))
