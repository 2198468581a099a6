"""Every Dataset constructor, transform and consumer, on real local Spark."""

from __future__ import annotations

import time
import json
import os
import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as sb
from session_kinds import spark_kind  # noqa: F401 - every test on classic and Spark Connect sessions


def test_range_count_and_take_return_the_rows(ctx):
    ds = sb.range(1000)
    assert ds.count() == 1000
    assert sorted(r["id"] for r in ds.take_all()) == list(range(1000))
    assert len(ds.take(5)) == 5


def test_from_items_wraps_scalars_and_keeps_dicts(ctx):
    assert sorted(r["item"] for r in sb.from_items([3, 1, 2]).take_all()) == [1, 2, 3]
    rows = sb.from_items([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]).take_all()
    assert sorted(rows, key=lambda r: r["a"]) == [{"a": 1, "b": "x"}, {"a": 2, "b": "y"}]


def test_map_flat_map_filter_transform_rows(ctx):
    ds = (
        sb.range(100)
        .map(lambda r: {"id": r["id"], "sq": r["id"] ** 2})
        .flat_map(lambda r: [r, {"id": -r["id"], "sq": r["sq"]}])
        .filter(lambda r: r["id"] % 2 == 0)
    )
    rows = ds.take_all()
    assert len(rows) == 100  # 50 even ids, each twice (positive and negative)
    assert all(r["sq"] == r["id"] ** 2 for r in rows)


@pytest.mark.parametrize("batch_format", ["pyarrow", "pandas", "numpy"])
def test_map_batches_gives_each_format_its_type_and_batch_size(ctx, batch_format):
    expected_type = {"pyarrow": pa.Table, "pandas": pd.DataFrame, "numpy": dict}[batch_format]

    def double(batch):
        assert isinstance(batch, expected_type)
        assert len(batch["id"]) <= 16
        if batch_format == "pyarrow":
            return batch.append_column("double", pa.compute.multiply(batch["id"], 2))
        batch["double"] = batch["id"] * 2
        return batch

    rows = sb.range(100).map_batches(double, batch_size=16, batch_format=batch_format).take_all()
    assert sorted((r["id"], r["double"]) for r in rows) == [(i, 2 * i) for i in range(100)]


def test_map_batches_numpy_2d_output_becomes_fixed_size_list(ctx):
    def embed(batch):
        return {"id": batch["id"], "vec": np.ones((len(batch["id"]), 4), dtype=np.float32)}

    ds = sb.range(10).map_batches(embed, batch_format="numpy")
    assert ds.schema().field("vec").type == pa.list_(pa.float32(), 4)


def test_limit_returns_exactly_n_rows_and_stops_upstream(ctx):
    ds = sb.range(10_000, override_num_blocks=20).limit(15)
    assert len(ds.take_all()) == 15
    source = ds.last_run_stats.ops[0]
    assert source.tasks_done < 20


def test_repartition_gives_exactly_n_blocks_with_all_rows(ctx):
    ds = sb.range(1000, override_num_blocks=3).repartition(7).materialize()
    assert ds.num_blocks() == 7
    assert sorted(r["id"] for r in ds.take_all()) == list(range(1000))


def test_materialize_keeps_blocks_and_reuses_them_without_recomputing(ctx, tmp_path):
    marker = tmp_path / "calls"
    marker.mkdir()

    def touch(batch):
        (marker / f"{os.getpid()}-{batch['id'][0].as_py()}").write_text("x")
        return batch

    mat = sb.range(50, override_num_blocks=5).map_batches(touch, batch_format="pyarrow").materialize()
    calls = len(list(marker.iterdir()))
    assert mat.count() == 50 and mat.count() == 50
    assert len(list(marker.iterdir())) == calls == 5


def test_iter_batches_and_iter_rows(ctx):
    batches = list(sb.range(100).iter_batches(batch_size=30, batch_format="pandas"))
    assert [len(b) for b in batches] == [30, 30, 30, 10]
    assert sorted(r["id"] for r in sb.range(10).iter_rows()) == list(range(10))


def test_iter_split_shards_one_execution_between_consumers(ctx):
    shards = sb.range(1000, override_num_blocks=10).iter_split(3)
    seen: list[list[int]] = [[] for _ in shards]

    def consume(i):
        for batch in shards[i].iter_batches(batch_size=None, batch_format="pyarrow"):
            seen[i].extend(batch["id"].to_pylist())

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(x for s in seen for x in s) == list(range(1000))


def test_schema_of_transformed_dataset(ctx):
    schema = sb.range(5).map(lambda r: {"name": str(r["id"])}).schema()
    assert schema.names == ["name"] and schema.field("name").type == pa.string()


def test_stats_report_every_operator_after_execution(ctx):
    ds = sb.range(100).map_batches(lambda b: b, num_cpus=0.5, batch_format="pyarrow")
    assert "not been executed" in ds.stats()
    ds.count()
    text = ds.stats()
    assert "ReadRange" in text and "MapBatches(<lambda>)" in text and "peak buffered" in text
    assert ds.last_run_stats.ops[1].rows_out == 100


class _SlowToLoad:
    """A stand-in for a model: building a copy takes 0.3 s."""

    def __init__(self):
        time.sleep(0.3)

    def __call__(self, batch):
        return batch


def test_stats_say_where_cold_starts_went(ctx):
    """Issue 28: how long Spark partitions took to reach task code, and model copies to build."""
    ds = sb.range(40, override_num_blocks=4).map_batches(_SlowToLoad, concurrency=2, batch_format="pyarrow")
    assert ds.count() == 40
    model = ds.last_run_stats.ops[-1]
    # at least one copy: the cap bounds live copies, not builds (a task that Spark hands to a worker
    # without one has another released and builds its own: seen 3 for a cap of 2 on 4 slots)
    assert model.copies_built >= 1 and model.build_s >= 0.3 * model.copies_built
    read = ds.last_run_stats.ops[0]
    assert read.starts >= 1 and read.first_start_s is not None and read.start_s > 0
    text = ds.stats()
    assert "Starts:" in text and f"{model.copies_built} model cop" in text and "Spark partition(s) started" in text


def test_write_and_read_parquet_json_csv_round_trip(ctx, tmp_path):
    ds = sb.range(200, override_num_blocks=4).map(lambda r: {"id": r["id"], "name": f"n{r['id']}"})
    for fmt, reader in (("parquet", sb.read_parquet), ("json", sb.read_json), ("csv", sb.read_csv)):
        out = tmp_path / fmt
        result = getattr(ds, f"write_{fmt}")(str(out))
        assert sorted(result.committed) == [0, 1, 2, 3] and result.rows == 200
        partition_dirs = [os.path.relpath(f, out).split(os.sep)[0] for f in result.files]
        assert partition_dirs == ["p00000", "p00001", "p00002", "p00003"]
        rows = reader(str(out)).take_all()
        assert sorted((r["id"], r["name"]) for r in rows) == [(i, f"n{i}") for i in range(200)]


def test_read_parquet_splits_row_groups_to_fill_slots(ctx, tmp_path):
    path = tmp_path / "one.parquet"  # 4 row groups of ~1.6 MB: one per slot
    pq.write_table(pa.table({"x": np.arange(800_000), "y": np.zeros(800_000)}), path, row_group_size=200_000)
    ds = sb.read_parquet(str(path), columns=["x"])
    assert ds.materialize().count() == 800_000  # a run (count() alone reads the footers only)
    assert ds.last_run_stats.ops[0].tasks_done == 4


def test_read_partitioning_splits_row_groups_for_the_slots_and_respects_override(ctx, tmp_path):
    path = tmp_path / "small.parquet"  # 32 KB in 4 row groups: a task each (two per slot would be 8)
    pq.write_table(pa.table({"x": list(range(4000))}), path, row_group_size=1000)
    ds = sb.read_parquet(str(path))
    assert ds.materialize().count() == 4000 and ds.last_run_stats.ops[0].tasks_done == 4
    ds = sb.read_parquet(str(path), override_num_blocks=3)
    assert ds.materialize().count() == 4000 and ds.last_run_stats.ops[0].tasks_done == 3


def test_read_text_and_binary_files(ctx, tmp_path):
    (tmp_path / "a.txt").write_text("hello\n\nworld\n")
    (tmp_path / "b.bin").write_bytes(b"\x00\x01")
    text = sb.read_text(str(tmp_path / "a.txt"), drop_empty_lines=True).take_all()
    assert [r["text"] for r in text] == ["hello", "world"]
    binary = sb.read_binary_files(str(tmp_path / "b.bin"), include_paths=True).take_all()
    assert binary == [{"path": str(tmp_path / "b.bin"), "bytes": b"\x00\x01"}]


def test_read_json_array_file(ctx, tmp_path):
    (tmp_path / "x.json").write_text(json.dumps([{"a": 1}, {"a": 2}]))
    assert sorted(r["a"] for r in sb.read_json(str(tmp_path / "x.json")).take_all()) == [1, 2]
