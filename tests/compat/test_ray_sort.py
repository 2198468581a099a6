"""Ray Data's ``Dataset.sort`` (issue 32): a distributed sort on real local Spark.

Input is spread over several blocks and shuffled inside each by a map, so every check needs
the barrier's range partitioning (sampled boundaries, one reduce task per key range) to be
right across blocks; expected results are computed independently with pandas.
"""

from __future__ import annotations

import glob
import math
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as rd


def _shuffled(batch):
    """The block's rows in a fixed random order, with a low-cardinality and a string column."""
    order = np.random.default_rng(int(batch["id"][0]) if len(batch["id"]) else 0).permutation(len(batch["id"]))
    ids = batch["id"][order]
    return {"id": ids, "g": ids % 7, "s": np.array([f"k{x % 13:02d}" for x in ids], dtype=object)}


def _input(n: int = 1000, blocks: int = 7):
    return rd.range(n, override_num_blocks=blocks).map_batches(_shuffled)


def test_sort_is_global_across_blocks_in_every_consumer(ctx):
    ds = _input().sort("id")
    assert [row["id"] for row in ds.take_all()] == list(range(1000))
    assert [row["id"] for row in ds.iter_rows()] == list(range(1000))
    assert np.concatenate([b["id"] for b in ds.iter_batches(batch_size=64)]).tolist() == list(range(1000))
    assert ds.to_pandas()["id"].tolist() == list(range(1000))
    assert ds.take(3) == [{"id": i, "g": i % 7, "s": f"k{i % 13:02d}"} for i in range(3)]
    materialized = ds.materialize()
    assert materialized.num_blocks() > 1  # the rows were range-partitioned, not gathered in one task
    assert [row["id"] for row in materialized.take_all()] == list(range(1000))
    descending = _input().sort("id", descending=True)
    assert [row["id"] for row in descending.iter_rows()] == list(range(999, -1, -1))


def _slow_on_zero(batch):
    if 0 in batch["id"]:
        time.sleep(1.5)  # the range with the smallest keys finishes last
    return batch


def test_streaming_consumers_and_limits_after_a_sort_wait_for_key_order(ctx, tmp_path):
    (tmp_path / "in").mkdir()
    for part in range(5):  # files: consumers of a file read take blocks as they come, but not after a sort
        ids = np.random.default_rng(part).permutation(np.arange(part * 120, (part + 1) * 120))
        pq.write_table(pa.table({"id": ids}), tmp_path / "in" / f"part-{part}.parquet")
    ds = rd.read_parquet(str(tmp_path / "in")).sort("id").map_batches(_slow_on_zero)
    assert [row["id"] for row in ds.limit(5).take_all()] == [0, 1, 2, 3, 4]
    assert [row["id"] for row in ds.iter_rows()] == list(range(600))


def test_multi_key_sort_with_strings_and_mixed_directions_matches_pandas(ctx):
    expected = pd.DataFrame(_input().take_all()).sort_values(["s", "g", "id"], ascending=[True, False, True])
    got = _input().sort(["s", "g", "id"], descending=[False, True, False]).to_pandas()
    assert got[["s", "g", "id"]].values.tolist() == expected[["s", "g", "id"]].values.tolist()
    strings = [row["s"] for row in _input().sort("s", descending=True).take_all()]
    assert strings == sorted((f"k{i % 13:02d}" for i in range(1000)), reverse=True)
    # a key with few values: ranges cut between runs of equal keys; within a key, input order is not promised
    by_group = _input().sort("g", descending=True).take_all()
    assert [row["g"] for row in by_group] == sorted((i % 7 for i in range(1000)), reverse=True)
    assert sorted(row["id"] for row in by_group) == list(range(1000))


def test_nulls_and_nans_sort_last_in_either_direction(ctx):
    values = [3.0, None, float("nan"), -1.0, 2.5, None, 10.0, float("nan"), 0.0]
    rows = [{"v": v, "i": i} for i, v in enumerate(values)]
    ds = rd.from_items(rows, override_num_blocks=3).map_batches(lambda t: t.take(list(range(t.num_rows))[::-1]),
                                                                batch_format="pyarrow")  # keeps nulls
    numbers = sorted(v for v in values if v is not None and not math.isnan(v))

    def shape(out):
        return ["null" if v is None else "nan" if math.isnan(v) else v for v in (row["v"] for row in out)]

    assert shape(ds.sort("v").take_all()) == numbers + ["nan", "nan", "null", "null"]
    assert shape(ds.sort("v", descending=True).take_all()) == numbers[::-1] + ["nan", "nan", "null", "null"]
    strings = rd.from_items([{"s": s} for s in ["b", None, "a", "c", None]], override_num_blocks=2)
    assert [row["s"] for row in strings.sort("s").take_all()] == ["a", "b", "c", None, None]


def test_all_equal_keys_and_empty_inputs(ctx):
    same = rd.range(300, override_num_blocks=5).map_batches(lambda b: {"id": b["id"], "k": b["id"] * 0})
    out = same.sort("k").take_all()
    assert len(out) == 300 and sorted(row["id"] for row in out) == list(range(300))
    assert rd.range(50, override_num_blocks=3).filter(lambda row: False).sort("id").take_all() == []
    assert rd.from_items([]).sort("x").take_all() == []
    assert rd.range(50, override_num_blocks=3).filter(lambda row: False).sort("id").count() == 0


def test_rays_argument_errors(ctx):
    ds = rd.range(10)
    with pytest.raises(ValueError, match="there's no such column.*'nope'|'nope'.*no such column"):
        ds.sort("nope")
    with pytest.raises(ValueError, match="'missing'"):
        ds.sort(["id", "missing"])
    with pytest.raises(ValueError, match="length of descending"):
        ds.sort(["id"], descending=[True, False])
    with pytest.raises(ValueError, match="key must"):
        ds.sort([])


def test_quarantine_before_a_sort_is_refused_as_before_a_repartition(ctx, tmp_path):
    quarantining = rd.range(10).map(lambda row: row, on_error="quarantine").sort("id")
    with pytest.raises(ValueError, match=r"before a repartition\(\), sort\(\) or groupby\(\)"):
        quarantining.write_parquet(str(tmp_path / "out"))


def test_a_sorted_write_holds_every_row_once_in_key_order_by_file_name(ctx, tmp_path):
    out = str(tmp_path / "sorted")
    _input(600, 5).sort("id", descending=True).write_parquet(out)
    files = sorted(glob.glob(f"{out}/**/*.parquet", recursive=True))
    assert len(files) > 1
    ids = [i for path in files for i in pq.read_table(path).column("id").to_pylist()]
    assert ids == list(range(599, -1, -1))


def test_a_sorted_write_to_the_s3_server_reads_back_in_key_order(ctx, s3_bucket):
    written = _input(300, 3).sort("id").write_parquet(f"{s3_bucket}/sorted")
    assert written.rows == 300 and len(written.files) > 1
    assert [row["id"] for row in rd.read_parquet(f"{s3_bucket}/sorted").take_all()] == list(range(300))


@pytest.mark.parametrize("descending", [False, True])
def test_the_numpy_boundary_search_agrees_with_the_key_comparison(descending):
    """The driver's fast cut (`searchsorted_cuts`) and its general one (`compare_keys`) place every
    boundary alike, duplicates, strings and null or NaN boundaries included (no Spark needed)."""
    from airflow_streambatch.engine.execution.operators.sort import _first_not_before, searchsorted_cuts

    rng = np.random.default_rng(7)
    for values in (rng.integers(0, 20, 300), rng.random(300).round(2), [f"w{v:03d}" for v in rng.integers(0, 50, 300)]):
        column = pa.chunked_array([pa.array(sorted(values, reverse=descending))])
        pool = sorted(set(column.to_pylist()), reverse=descending)
        boundaries = [pool[0], pool[len(pool) // 3], pool[len(pool) // 2], pool[-1]]
        boundaries += ([float("nan")] if isinstance(pool[0], float) else []) + [None]  # these sort after values
        table = pa.table({"k": column})
        general = [_first_not_before(table, (b,), (descending,)) for b in boundaries]
        assert searchsorted_cuts(column, boundaries, descending) == general
    assert searchsorted_cuts(pa.chunked_array([pa.array([1.0, None])]), [1.0], False) is None  # nulls: general path


def test_given_boundaries_cut_one_block_per_range_as_rays_do(ctx):
    """Ray's ``sort(boundaries=)``: a row below boundary ``b`` goes to a block before ``b``'s, a row at or
    above it to one after; descending, the blocks come highest first. (Ray's own example: 1,000 ids.)"""
    cases = [(False, [100, 300, 500, 700, 900]), (True, [1, 998]), (False, [501.5]), (True, [900, 100, 500])]
    for descending, boundaries in cases:
        ds = _input().sort("id", descending=descending, boundaries=boundaries).materialize()
        cuts = [0] + sorted(math.ceil(b) for b in boundaries) + [1000]  # ids below b: those < ceil(b)
        expected = [list(range(lo, hi)) for lo, hi in zip(cuts, cuts[1:])]
        if descending:
            expected = [block[::-1] for block in expected[::-1]]
        blocks = [batch["id"].tolist() for batch in ds.iter_batches(batch_size=None)]
        assert blocks == expected, (descending, boundaries)


def test_given_boundaries_keep_nulls_last_skip_empty_ranges_and_take_only_numbers(ctx):
    rows = [{"v": v} for v in [5, None, 12, 7, 30, None, 25, 12]]
    ds = rd.from_items(rows, override_num_blocks=3)

    def blocks(sorted_ds):
        return [batch["v"].to_pylist() for batch in sorted_ds.iter_batches(batch_size=None, batch_format="pyarrow")]

    assert blocks(ds.sort("v", boundaries=[10, 20, 100])) == [[5, 7], [12, 12], [25, 30], [None, None]]
    assert blocks(ds.sort("v", boundaries=[0, 10])) == [[5, 7], [12, 12, 25, 30, None, None]]  # none below 0
    down = blocks(ds.sort("v", descending=True, boundaries=[10, 20]))
    assert down == [[30, 25], [12, 12], [7, 5, None, None]]  # nulls sort last either way: in the last range
    assert [row["id"] for row in rd.range(20).sort("id", boundaries=[]).take_all()] == list(range(20))  # sampled
    with pytest.raises(ValueError, match="boundaries must be a list of numbers"):
        rd.range(10).sort("id", boundaries=["a"])
    with pytest.raises(ValueError, match="boundaries cut a column of numbers"):
        rd.from_items([{"s": "a"}, {"s": "b"}]).sort("s", boundaries=[1]).take_all()
