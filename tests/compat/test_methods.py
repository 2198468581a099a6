"""Ray Data's constructors, column operations, aggregates and consumers (issue 17, item 2),
each pinned to the behaviour its API reference documents, on real local Spark."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.aggregate import Min, Std


def test_from_pandas_arrow_numpy_and_blocks_make_one_block_per_input_in_order(ctx):
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    assert rd.from_pandas(df).take_all() == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]
    ds = rd.from_pandas([df, df.assign(a=[3, 4])])
    assert ds.num_blocks() == 2 and sorted(r["a"] for r in ds.take_all()) == [1, 2, 3, 4]
    assert rd.from_arrow(pa.table({"a": [5]})).take_all() == [{"a": 5}]
    # from_numpy: a column named "data"; rows of a 2-D array are fixed-shape arrays
    batch = rd.from_numpy(np.arange(6).reshape(3, 2)).take_batch(3)
    assert batch["data"].shape == (3, 2) and batch["data"].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert sorted(r["data"] for r in rd.from_numpy([np.arange(2), np.arange(2, 4)]).take_all()) == [0, 1, 2, 3]
    assert sorted(r["k"] for r in rd.from_blocks([{"k": np.array([1])}, pd.DataFrame({"k": [2]})]).take_all()) == [1, 2]
    with pytest.raises(TypeError, match="expected a DataFrame"):
        rd.from_pandas([df, "not a frame"])


def test_column_operations(ctx):
    ds = rd.from_items([{"a": i, "b": i * 10, "c": str(i)} for i in range(4)])
    assert ds.columns() == ["a", "b", "c"]
    assert ds.select_columns(["c", "a"]).columns() == ["c", "a"]
    assert sorted(ds.select_columns("b").take_batch(4)["b"].tolist()) == [0, 10, 20, 30]
    assert ds.drop_columns(["b"]).columns() == ["a", "c"]
    assert ds.rename_columns({"a": "alpha"}).columns() == ["alpha", "b", "c"]
    assert ds.rename_columns(["x", "y", "z"]).columns() == ["x", "y", "z"]
    added = ds.add_column("d", lambda df: df["a"] + df["b"])  # a pandas batch by default, as in Ray
    assert sorted(r["d"] for r in added.take_all()) == [0, 11, 22, 33]
    replaced = ds.add_column("a", lambda batch: batch["a"] * -1, batch_format="numpy")
    assert sorted(r["a"] for r in replaced.take_all()) == [-3, -2, -1, 0] and replaced.columns() == ["a", "b", "c"]
    with pytest.raises(ValueError, match=r"select_columns: no column\(s\) \['nope'\]; the columns are"):
        ds.select_columns(["nope"]).take_all()


def test_random_sample_keeps_about_the_fraction_and_a_seed_repeats_it(ctx):
    ds = rd.range(2000, override_num_blocks=4)
    first = sorted(r["id"] for r in ds.random_sample(0.25, seed=7).take_all())
    assert 350 < len(first) < 650
    assert sorted(r["id"] for r in ds.random_sample(0.25, seed=7).take_all()) == first
    assert ds.random_sample(0.0).count() == 0 and ds.random_sample(1.0).count() == 2000
    with pytest.raises(ValueError, match="fraction must be between 0 and 1"):
        ds.random_sample(1.5)


def test_global_aggregates_match_numpy_and_follow_rays_shapes(ctx):
    values = np.arange(1, 101, dtype=float)
    ds = rd.from_items([{"x": v, "y": int(v) % 7} for v in values], override_num_blocks=5)
    assert ds.sum("x") == values.sum() and ds.min("x") == 1 and ds.max("x") == 100
    assert ds.mean("x") == pytest.approx(values.mean())
    assert ds.std("x") == pytest.approx(values.std(ddof=1)) and ds.std("x", ddof=0) == pytest.approx(values.std())
    assert ds.sum(["x", "y"]) == {"sum(x)": values.sum(), "sum(y)": int(sum(int(v) % 7 for v in values))}
    assert ds.max() == {"max(x)": 100, "max(y)": 6}  # every column
    assert sorted(ds.unique("y")) == list(range(7))
    assert rd.range(0).sum("id") is None  # Ray: None for an empty dataset
    with_null = rd.from_items([{"v": 1.0}, {"v": None}, {"v": 3.0}])
    assert with_null.mean("v") == 2.0 and with_null.mean("v", ignore_nulls=False) is None
    assert math.isclose(rd.from_items([{"v": 5}]).mean("v"), 5)


def test_global_aggregates_are_rays_aggregate_with_its_shapes(ctx):
    """Issue 32: ``sum``/``min``/``max``/``mean``/``std`` are ``Dataset.aggregate`` with `aggregate`'s
    built-ins, as Ray's are: one aggregate is a value (``on=None`` over one column, or a list of one),
    several a dict; None without rows; ``std`` of one value 0.0 (Ray's `Std`), as ``groupby`` gives."""
    ds = rd.from_items([{"x": 1.0, "s": "b"}, {"x": 3.0, "s": "a"}, {"x": None, "s": "c"}], override_num_blocks=3)
    assert rd.range(10).sum() == 45 and rd.range(10).max(["id"]) == 9  # Ray's _aggregate_result: one -> a value
    assert ds.min() == ds.aggregate(Min("x"), Min("s")) == {"min(x)": 1.0, "min(s)": "a"}
    assert ds.std(["x"]) == ds.aggregate(Std("x"))["std(x)"] == pytest.approx(math.sqrt(2))
    assert ds.mean("x", ignore_nulls=False) is None and ds.sum(["x"], ignore_nulls=False) is None
    assert rd.from_items([{"v": 5}]).std("v") == 0.0 == rd.from_items([{"v": 5}]).groupby(None).std("v").take_all()[
        0]["std(v)"]
    assert rd.from_items([]).max() is None and ds.filter(lambda row: False).max(["x", "s"]) is None


def test_consumers_take_batch_to_pandas_to_arrow_size_and_blocks(ctx):
    ds = rd.range(10, override_num_blocks=2)
    batch = ds.take_batch(3)
    assert set(batch) == {"id"} and len(batch["id"]) == 3 and isinstance(batch["id"], np.ndarray)
    assert isinstance(ds.take_batch(3, batch_format="pandas"), pd.DataFrame)
    frame = ds.to_pandas()
    assert isinstance(frame, pd.DataFrame) and sorted(frame["id"]) == list(range(10))
    with pytest.raises(ValueError, match=r"to_pandas\(limit=5\): the dataset has more than 5 rows"):
        ds.to_pandas(limit=5)
    table = ds.to_arrow()
    assert isinstance(table, pa.Table) and table.num_rows == 10
    assert ds.size_bytes() == table.nbytes and ds.num_blocks() == 2
    with pytest.raises(ValueError, match="take_batch: the dataset has no rows"):
        rd.range(0).take_batch()


def test_iter_torch_batches_yields_tensors(ctx):
    torch = pytest.importorskip("torch")
    batches = list(rd.range(10, override_num_blocks=2).iter_torch_batches(batch_size=4, device="cpu"))
    assert all(isinstance(b["id"], torch.Tensor) for b in batches)
    assert sorted(torch.cat([b["id"] for b in batches]).tolist()) == list(range(10))
