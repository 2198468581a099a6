"""``DataContext.execution_options.preserve_order`` (issue 17 item 3, issue 16 item 4).

Ray Data: off by default; on, a dataset's output is in input order and deterministic, so
``take(n)``/``limit(n)`` return the first ``n`` rows. Pinned on real local Spark with
tasks made to finish out of order (later blocks sleep less), through maps that change
block counts, a filter, a repartition, and a limit.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

import airflow_streambatch.engine as rd


def _late_first(batch):
    """Early ids finish last: without ordering, output would come back reversed-ish."""
    time.sleep(max(0.0, 0.3 - batch["id"][0] / 1000))
    return batch


def _explode(row):
    return [{"id": row["id"], "k": k} for k in range(3)]


@pytest.fixture()
def ordered(ctx):
    ctx.execution_options.preserve_order = True
    return ctx


def test_output_is_in_input_order_through_maps_filters_and_flat_maps(ordered):
    ds = (rd.range(300, override_num_blocks=12).map_batches(_late_first, batch_size=10)
          .filter(lambda row: row["id"] % 7 != 0).flat_map(_explode))
    rows = ds.take_all()
    expected = [(i, k) for i in range(300) if i % 7 for k in range(3)]
    assert [(r["id"], r["k"]) for r in rows] == expected
    assert [(r["id"], r["k"]) for r in ds.take_all()] == expected  # the same on every run
    ids = np.concatenate([b["id"] for b in ds.iter_batches(batch_size=64)])
    assert ids.tolist() == [i for i, _ in expected]


def test_limit_and_take_give_the_first_rows_of_the_input(ordered):
    ds = rd.range(1000, override_num_blocks=10).map_batches(_late_first)
    assert [r["id"] for r in ds.take(5)] == [0, 1, 2, 3, 4]
    assert [r["id"] for r in ds.limit(150).take_all()] == list(range(150))
    assert ds.take_batch(3)["id"].tolist() == [0, 1, 2]


def test_repartition_keeps_the_order(ordered):
    ds = rd.range(500, override_num_blocks=5).map_batches(_late_first).repartition(7)
    assert [r["id"] for r in ds.take_all()] == list(range(500))


def test_the_option_is_checked_and_copied_with_the_context(ordered):
    assert rd.DataContext.get_current().execution_options.preserve_order is True
    assert ordered.copy().execution_options.preserve_order is True
    with pytest.raises(ValueError, match="preserve_order must be True or False"):
        ordered.execution_options.preserve_order = "yes"
    assert rd.DataContext().execution_options.preserve_order is False  # Ray's default


def _jitter(batch):
    """Read tasks finish out of order (seeded per id), so blocks reach the next map out of order."""
    time.sleep(random.Random(int(batch["id"][0])).uniform(0, 0.03))
    return batch


def test_tiny_blocks_of_many_read_tasks_stay_in_order_when_bundled(ordered):
    """One-row blocks of 200 read tasks arriving out of order: a map task may bundle blocks of
    different read tasks only when no block can fall between them, pending upstream or already
    taken by another of its tasks (a bundle of 3 and 5 while 4 ran alone came out 3, 5, 4)."""
    for _ in range(3):
        ds = (rd.range(200, override_num_blocks=200).map_batches(_jitter, batch_format="pyarrow")
              .map_batches(lambda b: b, num_cpus=0.5, batch_format="pyarrow"))
        assert [r["id"] for r in ds.take_all()] == list(range(200))
