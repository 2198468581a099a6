"""Ray Data's ``groupby`` / ``aggregate`` / ``map_groups`` (issue 32) on real local Spark.

Groups are range-partitioned by key across reduce tasks (`execution/operators/sort.py`); the
input spans several blocks, each shuffled by a map, so a group's rows start in every block.
Expected values are computed independently with pandas.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.aggregate import AggregateFn, Count, Max, Mean, Min, Std, Sum


def _shuffled(batch):
    order = np.random.default_rng(int(batch["id"][0]) if len(batch["id"]) else 0).permutation(len(batch["id"]))
    ids = batch["id"][order]
    return {"id": ids, "g": ids % 7, "s": np.array([f"k{x % 3}" for x in ids], dtype=object),
            "x": (ids * 37 % 101).astype("float64")}


def _input():
    return rd.range(1000, override_num_blocks=7).map_batches(_shuffled)


def _frame():
    ids = np.arange(1000)
    return pd.DataFrame({"id": ids, "g": ids % 7, "s": [f"k{x % 3}" for x in ids], "x": (ids * 37 % 101) * 1.0})


def _close(a, b) -> bool:
    return all(math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9) for x, y in zip(a, b, strict=True))


def test_groupby_builtins_match_pandas_in_key_order_with_rays_column_names(ctx):
    frame, grouped = _frame(), _input().groupby("g")
    by_g = frame.groupby("g")
    assert grouped.count().take_all() == [{"g": g, "count()": int(n)} for g, n in by_g.size().items()]
    sums = grouped.sum("x").take_all()
    assert [row["g"] for row in sums] == list(range(7)) and _close([r["sum(x)"] for r in sums], by_g["x"].sum())
    assert [r["min(id)"] for r in grouped.min("id").take_all()] == by_g["id"].min().tolist()
    assert [r["max(id)"] for r in grouped.max("id").take_all()] == by_g["id"].max().tolist()
    assert _close([r["mean(x)"] for r in grouped.mean("x").take_all()], by_g["x"].mean())
    assert _close([r["std(x)"] for r in grouped.std("x").take_all()], by_g["x"].std(ddof=1))


def test_multi_key_aggregate_with_string_keys_and_aliases(ctx):
    out = _input().groupby(["s", "g"]).aggregate(Count(), Sum("id"), Mean("x", alias_name="avg"),
                                                  Min("x"), Max("id")).to_pandas()
    expected = _frame().groupby(["s", "g"]).agg(n=("id", "size"), total=("id", "sum"), avg=("x", "mean"),
                                                 lo=("x", "min"), hi=("id", "max")).reset_index()
    assert list(out.columns) == ["s", "g", "count()", "sum(id)", "avg", "min(x)", "max(id)"]
    assert out[["s", "g"]].values.tolist() == expected[["s", "g"]].values.tolist()  # sorted by key
    assert out["count()"].tolist() == expected["n"].tolist() and out["sum(id)"].tolist() == expected["total"].tolist()
    assert _close(out["avg"], expected["avg"]) and out["max(id)"].tolist() == expected["hi"].tolist()


def test_nulls_follow_rays_ignore_nulls_rules_and_a_single_value_has_std_zero(ctx):
    rows = [{"k": "a", "v": 1.0}, {"k": "a", "v": None}, {"k": "a", "v": 3.0}, {"k": "b", "v": None},
            {"k": "c", "v": 5.0}, {"k": None, "v": 7.0}, {"k": None, "v": 9.0}]
    ds = rd.from_items(rows, override_num_blocks=3)
    out = ds.groupby("k").aggregate(Count(), Count("v", ignore_nulls=True, alias_name="valid"), Sum("v"),
                                    Mean("v"), Std("v"), Sum("v", ignore_nulls=False, alias_name="strict")).take_all()
    assert out == [
        {"k": "a", "count()": 3, "valid": 2, "sum(v)": 4.0, "mean(v)": 2.0, "std(v)": math.sqrt(2.0), "strict": None},
        {"k": "b", "count()": 1, "valid": 0, "sum(v)": None, "mean(v)": None, "std(v)": None, "strict": None},
        {"k": "c", "count()": 1, "valid": 1, "sum(v)": 5.0, "mean(v)": 5.0, "std(v)": 0.0, "strict": 5.0},
        {"k": None, "count()": 2, "valid": 2, "sum(v)": 16.0, "mean(v)": 8.0, "std(v)": math.sqrt(2.0),
         "strict": 16.0},
    ]


def test_global_aggregates_and_empty_inputs(ctx):
    assert _input().groupby(None).count().take_all() == [{"count()": 1000}]
    result = _input().aggregate(Count(), Sum("id"), Max("x"), Std("id", ddof=0))
    assert result["count()"] == 1000 and result["sum(id)"] == 499500 and result["max(x)"] == 100.0
    assert math.isclose(result["std(id)"], np.arange(1000).std())
    empty = rd.range(30, override_num_blocks=3).filter(lambda row: False)
    assert empty.groupby("id").count().take_all() == []
    assert empty.aggregate(Count()) is None


def _normalize(group: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"g": group["g"], "id": group["id"], "dev": group["x"] - group["x"].mean()})


def test_map_groups_sees_each_whole_group_once_in_key_order(ctx):
    out = _input().groupby("g").map_groups(_normalize, batch_format="pandas").to_pandas()
    frame = _frame()
    expected = frame.assign(dev=frame["x"] - frame.groupby("g")["x"].transform("mean"))
    assert out["g"].tolist() == sorted(frame["g"])  # groups in key order
    merged = out.merge(expected, on="id")
    assert len(merged) == 1000 and _close(merged["dev_x"], merged["dev_y"])
    sizes = _input().groupby("s").map_groups(lambda b: {"s": b["s"][:1], "n": np.array([len(b["id"])])}).take_all()
    assert sizes == [{"s": "k0", "n": 334}, {"s": "k1", "n": 333}, {"s": "k2", "n": 333}]


def test_accumulator_style_aggregate_fn(ctx):
    distinct = AggregateFn(init=lambda key: set(), accumulate_row=lambda acc, row: acc | {row["s"]},
                           merge=lambda a, b: a | b, finalize=len, name="distinct_s")
    out = _input().groupby("g").aggregate(distinct).take_all()
    assert out == [{"g": g, "distinct_s": 3} for g in range(7)]
    rows = AggregateFn(init=lambda key: 0, accumulate_block=lambda acc, block: acc + block.num_rows, name="rows")
    whole = _input().groupby("s").aggregate(rows, Max("id"))  # without merge: whole groups reach the reduce task
    assert whole.take_all() == [{"s": "k0", "rows": 334, "max(id)": 999}, {"s": "k1", "rows": 333, "max(id)": 997},
                                {"s": "k2", "rows": 333, "max(id)": 998}]


def test_map_tasks_send_one_row_of_partials_per_group_to_the_barrier(ctx):
    counted = _input().groupby("g").count()
    assert [row["count()"] for row in counted.take_all()] == [143] * 6 + [142]
    map_side = next(op for op in counted.last_run_stats.ops if "PartialAggregate" in op.name)
    assert map_side.rows_out == 7 * map_side.tasks_done < 1000  # each map task: one row per group, not its rows


def test_unknown_columns_and_bad_aggregations_fail_as_in_ray(ctx):
    ds = rd.range(10)
    with pytest.raises(ValueError, match="'nope'"):
        ds.groupby("nope").count()
    with pytest.raises(ValueError, match="'y'"):
        ds.groupby("id").sum("y")
    with pytest.raises(TypeError, match="AggregateFn"):
        ds.groupby("id").aggregate("sum")


def _scattered(batch):
    """Keys scattered so each group's rows sit in several blocks; some keys and values null. ``x`` sits
    near 1e6, so a Std that merged partials' sums of squares naively would lose its digits."""
    ids = batch["id"]
    return pa.table({"id": ids, "k": pa.array(ids * 7919 % 2003, mask=ids % 97 == 0),
                     "x": pa.array(1e6 + ids * 37 % 101 / 7, mask=ids % 11 == 0),
                     "i": pa.array(ids % 1000 - 500, mask=ids % 13 == 0),
                     "s": np.array([f"s{v % 17:02}" for v in ids], dtype=object), "m": ids % 3})


def _same(actual, expected) -> bool:
    """Equal, pandas' missing values (NaN, NA) matching None, floats to 1e-9 relative."""
    if pd.isna(expected):
        return actual is None
    if isinstance(expected, float):
        return actual is not None and math.isclose(actual, expected, rel_tol=1e-9)
    return actual == expected


def test_many_groups_across_many_blocks_with_nulls_match_pandas(ctx):
    distinct = AggregateFn(init=lambda key: set(), accumulate_row=lambda acc, row: acc | {row["m"]},
                           merge=lambda a, b: a | b, finalize=len, name="distinct_m")
    aggs = [Count(), Count("x", ignore_nulls=True), Sum("x"), Sum("i", ignore_nulls=False, alias_name="strict"),
            Min("i"), Max("i"), Mean("x"), Std("x"), Std("i", ddof=0, alias_name="pstd"), Min("s"), distinct]
    rows = rd.range(12_000, override_num_blocks=12).map_batches(_scattered).groupby("k").aggregate(*aggs).take_all()
    ids = np.arange(12_000)
    frame = pd.DataFrame({"k": pd.array(np.where(ids % 97 == 0, None, ids * 7919 % 2003), dtype="Int64"),
                          "x": np.where(ids % 11 == 0, np.nan, 1e6 + ids * 37 % 101 / 7),
                          "i": pd.array(np.where(ids % 13 == 0, None, ids % 1000 - 500), dtype="Int64"),
                          "s": [f"s{v % 17:02}" for v in ids], "m": ids % 3})
    by = frame.groupby("k", dropna=False, sort=True)  # the null key last, as Arrow sorts it
    sizes, valid = by.size(), by["x"].count()
    expected = pd.DataFrame({
        "count()": sizes, "count(x)": valid, "sum(x)": by["x"].sum(min_count=1),
        "strict": by["i"].sum().astype("float64").where(by["i"].count() == sizes),
        "min(i)": by["i"].min(), "max(i)": by["i"].max(), "mean(x)": by["x"].mean(),
        "std(x)": by["x"].std(ddof=1).where(valid != 1, 0.0),  # Ray: 0.0 for a single value
        "pstd": by["i"].std(ddof=0), "min(s)": by["s"].min(), "distinct_m": by["m"].nunique()}).reset_index()
    assert list(rows[0]) == ["k", *expected.columns[1:]] and len(rows) == len(expected) == 2003 + 1
    assert [row["k"] for row in rows] == expected["k"].tolist()[:-1] + [None]  # keys ascending, null last
    for name in expected.columns[1:]:
        assert all(_same(row[name], value) for row, value in zip(rows, expected[name].tolist())), name


def test_a_block_whose_column_is_all_nulls_merges_with_typed_blocks(ctx):
    rows = [{"k": 1, "v": None}, {"k": 2, "v": None}, {"k": 1, "v": 2.5}, {"k": 3, "v": 4.0}]
    out = rd.from_items(rows, override_num_blocks=2).groupby("k").aggregate(Sum("v"), Min("v"), Std("v")).take_all()
    assert out == [{"k": 1, "sum(v)": 2.5, "min(v)": 2.5, "std(v)": 0.0},
                   {"k": 2, "sum(v)": None, "min(v)": None, "std(v)": None},
                   {"k": 3, "sum(v)": 4.0, "min(v)": 4.0, "std(v)": 0.0}]
