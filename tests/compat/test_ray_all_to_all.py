"""Ray Data's ``union``, ``random_shuffle``, ``zip``, ``streaming_split`` and ``repr`` (issue 32,
all-to-all part), each pinned to what Ray's ``dataset.py`` and its tests (test_union.py,
test_all_to_all.py, test_zip.py, test_consumption.py) promise, on real local Spark."""

from __future__ import annotations

import gc
import threading
from collections import Counter

import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as rd


def _ids(ds) -> list[int]:
    return [row["id"] for row in ds.take_all()]


# -- union ---------------------------------------------------------------------------
def test_union_has_the_rows_of_every_dataset_in_argument_order(ctx):
    """Ray (test_union.py): the union holds every row of each dataset; ``take_all`` keeps the
    datasets' order as given, each in its own order; a transform of the union runs on all rows."""
    a = rd.range(6, override_num_blocks=2)
    b = rd.from_items([{"id": 100 + i} for i in range(3)])
    c = rd.range(4, override_num_blocks=1).map(lambda r: {"id": r["id"] * 10})
    union = a.union(b, c)
    assert _ids(union) == [0, 1, 2, 3, 4, 5, 100, 101, 102, 0, 10, 20, 30]
    assert union.count() == 13
    doubled = union.map_batches(lambda t: {"id": t["id"] * 2})
    assert Counter(_ids(doubled)) == Counter(2 * i for i in [0, 1, 2, 3, 4, 5, 100, 101, 102, 0, 10, 20, 30])
    assert _ids(a.union(a)) == [0, 1, 2, 3, 4, 5] * 2  # a dataset with itself: each row twice
    nested = a.union(b).union(c)  # the inner union is gone: its blocks must live on in the outer one
    gc.collect()
    assert _ids(nested) == _ids(union)
    with pytest.raises(TypeError, match="every argument must be a Dataset"):
        a.union([1, 2])


def test_union_write_commits_each_partition_once(ctx, tmp_path):
    """A write of a union commits each partition of each dataset once: every row exactly once."""
    out = tmp_path / "out"
    union = rd.range(10, override_num_blocks=2).union(rd.range(5, override_num_blocks=3).map(
        lambda r: {"id": r["id"] + 1000}))
    result = union.write_parquet(str(out))
    assert len(result.committed) == 5 and result.rows == 15
    assert sorted(pq.read_table(str(out), columns=["id"]).column("id").to_pylist()) == (
        list(range(10)) + [1000, 1001, 1002, 1003, 1004])


# -- random_shuffle ----------------------------------------------------------------------
def test_random_shuffle_moves_rows_loses_none_and_a_seed_repeats_the_order(ctx):
    """Ray (test_all_to_all.py test_random_shuffle): the same rows in another order; a seed gives
    the same order on every run, another seed (or none) another order; as many blocks as before."""
    ds = rd.range(200, override_num_blocks=4)
    first = _ids(ds.random_shuffle(seed=7))
    assert sorted(first) == list(range(200)) and first != list(range(200))
    assert _ids(ds.random_shuffle(seed=7)) == first
    assert _ids(ds.random_shuffle(seed=8)) != first
    unseeded = _ids(ds.random_shuffle())
    assert sorted(unseeded) == list(range(200)) and unseeded != first
    # every output block mixes rows of every input block (each took a slice of each)
    blocks = [t.column("id").to_pylist() for t in ds.random_shuffle(seed=3)._iter_tables()]
    assert len(blocks) == 4
    assert all({i // 50 for i in block} == {0, 1, 2, 3} for block in blocks)


def test_a_write_of_a_shuffle_commits_each_output_block_once(ctx, tmp_path):
    """Each output block of the shuffle is one committed partition; the engine's own shuffle steps
    are not user functions, so a quarantining default does not refuse them before the barrier."""
    ctx.on_row_error = "quarantine"
    out = tmp_path / "shuffled"
    result = rd.range(60, override_num_blocks=3).random_shuffle(seed=5).write_parquet(str(out))
    assert sorted(result.committed) == [0, 1, 2] and result.rows == 60
    assert sorted(pq.read_table(str(out), columns=["id"]).column("id").to_pylist()) == list(range(60))


def test_random_shuffle_arguments_as_ray_checks_them(ctx):
    ds = rd.range(10)
    with pytest.raises(DeprecationWarning, match="Use repartition"):
        ds.random_shuffle(num_blocks=2)
    with pytest.raises(ValueError, match="seed"):
        ds.random_shuffle(seed="x")


# -- streaming_split ----------------------------------------------------------------------
def test_streaming_split_is_iter_split_under_rays_name(ctx):
    """Ray: a list of ``n`` iterators sharing one execution; together they see every row once;
    ``equal=True`` gives each the same count."""
    its = rd.range(40, override_num_blocks=4).streaming_split(2, equal=True)
    assert len(its) == 2
    seen: list[list[int]] = [[], []]

    def consume(i):
        seen[i] = [row["id"] for row in its[i].iter_rows()]

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(seen[0] + seen[1]) == list(range(40)) and len(seen[0]) == len(seen[1]) == 20
    with pytest.raises(ValueError, match="locality_hints 1 doesn't equal the number of splits 2"):
        rd.range(4).streaming_split(2, locality_hints=["node"])


# -- zip ----------------------------------------------------------------------------------------
def test_zip_joins_columns_by_row_position_across_different_block_layouts(ctx):
    """Ray (test_zip.py): row i of each dataset side by side, whatever the block layouts; a column
    name already taken becomes ``name_1``, then ``name_2``."""
    left = rd.range(10, override_num_blocks=3)
    right = rd.from_items([{"sq": i * i, "id": -i} for i in range(10)], override_num_blocks=4)
    third = rd.range(10, override_num_blocks=1).map(lambda r: {"id": r["id"] + 100})
    rows = left.zip(right, third).take_all()
    assert rows == [{"id": i, "sq": i * i, "id_1": -i, "id_2": i + 100} for i in range(10)]
    assert left.zip(right).count() == 10


def test_zip_refuses_different_row_counts_with_rays_text(ctx):
    with pytest.raises(ValueError, match="Cannot zip datasets of different number of rows: 10, 9"):
        rd.range(10).zip(rd.range(9))


def test_zip_write_commits_each_block_once(ctx, tmp_path):
    out = tmp_path / "zipped"
    result = rd.range(12, override_num_blocks=3).zip(
        rd.range(12, override_num_blocks=2).map(lambda r: {"twice": 2 * r["id"]})).write_parquet(str(out))
    assert result.rows == 12 and len(result.committed) == 3
    table = pq.read_table(str(out), columns=["id", "twice"]).sort_by("id")
    assert table.to_pylist() == [{"id": i, "twice": 2 * i} for i in range(12)]


# -- repr ------------------------------------------------------------------------------------------
def _double(row):
    return {"id": 2 * row["id"]}


def _fails(row):
    raise RuntimeError("a repr must not run the pipeline")


def test_repr_is_rays_form_and_runs_nothing(ctx):
    """Ray 2.x: operators last first, each under the next, down to ``Dataset(num_rows=, schema=)``;
    ``MaterializedDataset(num_blocks=, ...)`` once blocks exist; ``?``/``Unknown schema`` when
    printing would need a run."""
    ds = rd.range(10, override_num_blocks=3)
    assert repr(ds) == str(ds) == "Dataset(num_rows=10, schema={id: int64})"
    assert repr(ds.map(_double).limit(4)) == (
        "Limit[limit=4]\n+- Map(_double)\n   +- Dataset(num_rows=10, schema={id: int64})")
    assert repr(ds.random_shuffle(seed=1)) == "RandomShuffle\n+- Dataset(num_rows=10, schema={id: int64})"
    assert repr(ds.map(_fails)) == "Map(_fails)\n+- Dataset(num_rows=10, schema={id: int64})"  # nothing ran
    assert repr(rd.from_items([{"a": "x"}])) == \
        "Dataset(num_rows=1, schema=Unknown schema)"
    done = rd.from_items([{"a": "x", "b": 1.5}] * 6, override_num_blocks=3).materialize()
    assert repr(done) == "MaterializedDataset(num_blocks=3, num_rows=6, schema={a: string, b: double})"
    wide = rd.from_items([{f"column_number_{i}": i for i in range(6)}]).materialize()
    assert repr(wide).startswith("MaterializedDataset(\n   num_blocks=1,\n   num_rows=1,\n   schema={column_number_0")
