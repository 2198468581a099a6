"""Ray Data's ``AbsMax``, ``Quantile`` and ``Unique`` aggregates, all-null sums, and ``map_groups``'s
resource arguments (issue 32) on real local Spark.

Each group's rows sit in several blocks (keys scattered by a map), so the map side's partials
(a max of absolute values, each group's values, its distinct values) are merged in the reduce
tasks. Expected values are computed independently, per group in plain Python, from Ray's
documented rules (its quantile: ``k = (n - 1) * q`` over the sorted values, interpolated and
rounded to 5 decimals).
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pyarrow as pa
import pytest

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.aggregate import AbsMax, Count, Quantile, Sum, Unique
from airflow_streambatch.engine.plan.planner import plan


def _scattered(batch):
    ids = batch["id"].to_numpy()
    keys = ids * 7919 % 53
    return pa.table({"k": pa.array(keys), "i": pa.array(ids % 1000 - 700, mask=(ids % 13 == 0) & (keys % 2 == 0)),
                     "x": pa.array(ids * 37 % 101 / 7, mask=ids % 11 == 0),
                     "s": pa.array([f"s{v % 5}" for v in ids.tolist()], mask=ids % 17 == 0), "id": ids})


def _rows(n: int = 3000) -> list[dict]:
    return rd.range(n, override_num_blocks=1).map_batches(_scattered, batch_format="pyarrow").take_all()


def _ray_quantile(values: list, q: float):
    """Ray's Quantile, written from its documentation: None without values."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    low, high = math.floor(k), math.ceil(k)
    if low == high:
        return ordered[int(k)]
    return round(ordered[low] * (high - k) + ordered[high] * (k - low), 5)


def test_abs_max_quantile_and_unique_per_group_across_blocks(ctx):
    aggs = [AbsMax("i"), Quantile("x"), Quantile("i", q=0.3, alias_name="q30"),
            Quantile("i", ignore_nulls=False, alias_name="strict"), Unique("s"), Unique("s", ignore_nulls=True,
                                                                                       alias_name="seen"), Count()]
    source = rd.range(3000, override_num_blocks=6).map_batches(_scattered, batch_format="pyarrow")
    out = source.groupby("k").aggregate(*aggs).take_all()
    groups: dict[int, list[dict]] = {}
    for row in _rows():
        groups.setdefault(row["k"], []).append(row)
    assert [row["k"] for row in out] == sorted(groups)
    for row in out:
        rows = groups[row["k"]]
        ints = [r["i"] for r in rows if r["i"] is not None]
        assert row["abs_max(i)"] == max(abs(v) for v in ints)
        assert row["quantile(x)"] == _ray_quantile([r["x"] for r in rows if r["x"] is not None], 0.5)  # exactly
        assert row["q30"] == _ray_quantile(ints, 0.3)
        assert row["strict"] == (None if len(ints) < len(rows) else _ray_quantile(ints, 0.5))
        strings = {r["s"] for r in rows}
        assert row["unique(s)"] == sorted(strings - {None}) + ([None] if None in strings else [])  # Ray: a list
        assert row["seen"] == sorted(strings - {None}) and row["count()"] == len(rows)
    assert any(row["strict"] is None for row in out) and any(row["strict"] is not None for row in out)


def test_dataset_aggregate_with_rays_quantile_rounding_and_null_rules(ctx):
    ds = rd.from_items([{"v": v, "s": s} for v, s in [(0, "b"), (1, "a"), (-5, None), (None, "b")]],
                       override_num_blocks=2)
    result = ds.aggregate(AbsMax("v"), Quantile("v", q=1 / 3), Quantile("v", alias_name="med"),
                          Quantile("s", q=0.5), Unique("v"), Unique("s", alias_name="u"))
    assert result == {"abs_max(v)": 5, "quantile(v)": -1.66667, "med": 0.0, "quantile(s)": "b",
                      "unique(v)": [-5, 0, 1, None], "u": ["a", "b", None]}
    pair = rd.from_items([{"v": 0}, {"v": 1}]).aggregate(Quantile("v", q=1 / 3))
    assert pair == {"quantile(v)": 0.33333}  # Ray rounds an interpolated quantile to 5 decimals
    nulls = rd.from_items([{"k": 1, "v": None}, {"k": 1, "v": None}, {"k": 2, "v": 4.0}], override_num_blocks=3)
    out = nulls.groupby("k").aggregate(AbsMax("v"), Quantile("v"), Unique("v"),
                                       Unique("v", ignore_nulls=True, alias_name="u")).take_all()
    assert out == [{"k": 1, "abs_max(v)": None, "quantile(v)": None, "unique(v)": [None], "u": []},
                   {"k": 2, "abs_max(v)": 4.0, "quantile(v)": 4.0, "unique(v)": [4.0], "u": [4.0]}]
    with pytest.raises(ValueError, match="q must be a number between 0 and 1"):
        Quantile("v", q=1.5)
    with pytest.raises(ValueError, match="on= must name the column"):
        Unique()


def test_a_quantile_between_two_strings_is_refused():
    from airflow_streambatch.engine.worker.sorting import aggregate_groups

    with pytest.raises(TypeError, match="cannot be interpolated"):
        list(aggregate_groups(iter([pa.table({"s": ["a", "b"]})]), (), (Quantile("s"),), "Aggregate"))


def test_sums_over_only_nulls_are_none_as_in_ray(ctx):
    """Ray's Sum of a group (or dataset) whose every value is null: None, not 0 as pandas gives."""
    rows = [{"k": 1, "i": None, "x": None, "n": None}, {"k": 1, "i": None, "x": None, "n": None},
            {"k": 2, "i": 3, "x": 1.5, "n": None}]
    typed = pa.table({"k": [r["k"] for r in rows], "i": pa.array([r["i"] for r in rows], pa.int64()),
                      "x": pa.array([r["x"] for r in rows], pa.float64()), "n": pa.nulls(3)})
    ds = rd.from_arrow([typed.slice(0, 1), typed.slice(1)])
    out = ds.groupby("k").aggregate(Sum("i"), Sum("x"), Sum("n"), Sum("i", ignore_nulls=False, alias_name="s")
                                    ).take_all()
    assert out == [{"k": 1, "sum(i)": None, "sum(x)": None, "sum(n)": None, "s": None},
                   {"k": 2, "sum(i)": 3, "sum(x)": 1.5, "sum(n)": None, "s": 3}]
    only_nulls = rd.from_arrow([typed.slice(0, 1), typed.slice(1, 1)])
    assert only_nulls.aggregate(Sum("i"), Sum("x"), Sum("n")) == {"sum(i)": None, "sum(x)": None, "sum(n)": None}
    assert only_nulls.sum("i") is None and only_nulls.sum(["x", "n"]) == {"sum(x)": None, "sum(n)": None}


class _Spans:
    """Built once per worker; each call records when it ran and on which GPUs, to count overlaps."""

    def __init__(self, out_dir: str, label: str):
        self.out_dir, self.label = out_dir, label

    def __call__(self, group):
        start = time.time()
        time.sleep(0.05)
        with open(os.path.join(self.out_dir, f"{os.getpid()}-{time.time_ns()}"), "w") as handle:
            handle.write(f"{start} {time.time()} {os.environ.get('CUDA_VISIBLE_DEVICES', '-')}")
        return {"k": group["k"][:1], "rows": np.array([len(group["k"])]), "label": np.array([self.label])}


def _max_overlap(out_dir) -> tuple[int, set[str]]:
    spans = [open(os.path.join(out_dir, name)).read().split() for name in os.listdir(out_dir)]
    spans = [(float(a), float(b), gpus) for a, b, gpus in spans]
    peak = max(sum(1 for a, b, _ in spans if a <= s < b) for s, _, _ in spans)
    return peak, {gpus for _, _, gpus in spans}


def test_map_groups_takes_rays_resource_arguments(ctx, tmp_path):
    grouped = rd.range(700, override_num_blocks=7).map_batches(lambda b: {"k": b["id"] % 7}).groupby("k")
    expected = [{"k": k, "rows": 100, "label": "m"} for k in range(7)]
    capped = tmp_path / "capped"
    capped.mkdir()
    ds = grouped.map_groups(_Spans, compute=rd.ActorPoolStrategy(size=1), fn_constructor_args=(str(capped), "m"))
    assert ds.take_all() == expected
    assert _max_overlap(capped)[0] == 1  # one instance at a time: the reduce tasks ran one by one
    ctx.resources = {"CPU": 4, "GPU": 2}
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    on_gpus = grouped.map_groups(_Spans, num_gpus=1, fn_constructor_kwargs={"out_dir": str(gpus), "label": "m"})
    assert [op.compute.as_dict() for op in plan(on_gpus._logical) if "MapGroups" in op.name] == [{"GPU": 1.0}]
    assert on_gpus.take_all() == expected
    peak, seen = _max_overlap(gpus)
    assert peak <= 2 and seen <= {"0", "1"}  # each reduce task held one of the two GPUs
    with pytest.raises(ValueError, match="actor compute strategy"):
        grouped.map_groups(_Spans, compute=rd.TaskPoolStrategy(size=1))
    with pytest.raises(TypeError, match=r"\['memory'\] not supported"):
        grouped.map_groups(lambda g: g, memory=10)
