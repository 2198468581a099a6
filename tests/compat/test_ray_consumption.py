"""Ray Data's first-hour consumers (issue 32): ``schema()`` as Ray's `Schema`, ``input_files()``,
``len()``, ``take_all(limit)``, ``fully_executed``, the iteration arguments (``drop_last``, the
local shuffle buffer, prefetching) and input order from in-memory sources and ``range``.

Written from the behaviour Ray Data's documentation and its consumption/iterator tests rely
on, on real local Spark (and the S3 server for ``input_files`` paths). Order tests make early
blocks finish last, so rows returned as they arrive would come back out of order.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.dataset import MaterializedDataset, Schema


def _early_rows_last(batch):
    """Blocks holding low ids sleep longest: their tasks finish after later ones."""
    time.sleep(max(0.0, 0.25 - int(batch["id"][0]) / 400))
    return batch


def _ids(rows) -> list[int]:
    return [row["id"] for row in rows]


# -- schema, len, take_all, fully_executed ------------------------------------------------------
def test_schema_is_rays_schema_with_its_names_types_equality_and_table(ctx):
    ds = rd.from_items([{"text": "spam", "number": 0}])
    schema = ds.schema()
    assert isinstance(schema, Schema) and isinstance(schema.base_schema, pa.Schema)
    assert schema.names == ["text", "number"] and schema.types == [pa.string(), pa.int64()]
    assert schema == Schema(pa.schema([("text", pa.string()), ("number", pa.int64())]))
    assert schema != Schema(pa.schema([("text", pa.string()), ("number", pa.float64())]))
    assert repr(schema) == "Column  Type\n------  ----\ntext    string\nnumber  int64"
    assert str(rd.from_items([{"long_column_name": "x"}]).schema()) == (
        "Column            Type\n------            ----\nlong_column_name  string")
    assert schema.field("number").type == pa.int64()  # the Arrow schema's own attributes still work
    # known once a run has read a block; a new dataset knows nothing until it runs
    assert ds.schema(fetch_if_missing=False) == schema
    mapped = ds.map(lambda row: row)
    assert mapped.schema(fetch_if_missing=False) is None and mapped.columns(fetch_if_missing=False) is None
    mapped.take_all()
    assert mapped.columns(fetch_if_missing=False) == ["text", "number"]
    assert rd.range(0).schema() is None


def test_len_points_to_count_and_take_all_enforces_its_limit(ctx):
    ds = rd.range(5)
    with pytest.raises(TypeError, match=r"count\(\)"):
        len(ds)
    assert bool(ds) is True  # truthiness does not need a length
    assert ds.count() == 5
    assert _ids(ds.take_all()) == [0, 1, 2, 3, 4]
    assert _ids(ds.take_all(limit=5)) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="more than the given limit of 4"):
        ds.take_all(4)
    with pytest.raises(ValueError, match="take_all"):
        ds.take_all(-1)


def test_fully_executed_is_rays_deprecated_name_for_materialize(ctx):
    ds = rd.range(10, override_num_blocks=3)
    with pytest.warns(DeprecationWarning, match="materialize"):
        done = ds.fully_executed()
    assert isinstance(done, MaterializedDataset) and done.count() == 10
    with pytest.warns(DeprecationWarning, match="MaterializedDataset"):
        assert done.is_fully_executed() and not ds.is_fully_executed()
    assert done.materialize() is done  # its blocks exist already


# -- input_files -----------------------------------------------------------------------------------
def _write_csvs(root, names):
    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        (root / name).write_text(f"one,two\n{i},x\n")
    return [str(root / name) for name in names]


def test_input_files_lists_the_files_a_read_reads_without_running_it(ctx, tmp_path):
    first, second, notes = _write_csvs(tmp_path / "in", ["a.csv", "b.csv", "notes.txt"])
    ds = rd.read_csv(str(tmp_path / "in"), file_extensions=["csv"]).map(lambda row: row)
    assert ds.input_files() == [first, second]
    assert ds.last_run_stats is None  # listed, not read
    assert rd.read_csv([first, str(tmp_path / "missing.csv")], ignore_missing_paths=True).input_files() == [first]
    assert rd.read_text(notes).input_files() == [notes]
    assert ds.materialize().limit(1).input_files() == [first, second]  # a materialized read remembers them
    pq_path = tmp_path / "t.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2]}), pq_path, row_group_size=1)
    assert rd.read_parquet(str(pq_path), override_num_blocks=2).input_files() == [str(pq_path)]
    assert rd.from_items([1, 2]).input_files() == [] and rd.range(3).input_files() == []


def test_input_files_on_s3_drop_the_scheme_as_ray_does(ctx, s3_bucket):
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    for name in ("a.csv", "b.csv"):
        with fs.open_output_stream(f"{bucket}/in/{name}") as out:
            out.write(b"one\n1\n")
    ds = rd.read_csv(f"{s3_bucket}/in")
    assert ds.input_files() == [f"{bucket}/in/a.csv", f"{bucket}/in/b.csv"]
    assert rd.read_csv(f"{bucket}/in/b.csv", filesystem=fs).input_files() == [f"{bucket}/in/b.csv"]
    assert sorted(r["one"] for r in ds.take_all()) == [1, 1]


# -- order -------------------------------------------------------------------------------------------
def test_from_items_range_and_from_pandas_come_back_in_input_order(ctx):
    records = [{"a": i} for i in range(20)]
    for blocks in (1, 7, 20):
        ds = rd.from_items(records, override_num_blocks=blocks)
        assert ds.take_all() == records and ds.num_blocks() == blocks
    slow_first = rd.range(100, override_num_blocks=20).map_batches(_early_rows_last)
    assert _ids(slow_first.take_all()) == list(range(100))
    assert _ids(slow_first.limit(11).take(200)) == list(range(11))
    assert slow_first.take_batch(3)["id"].tolist() == [0, 1, 2]
    assert _ids(slow_first.iter_rows()) == list(range(100))
    assert np.concatenate([b["id"] for b in slow_first.iter_batches(batch_size=7)]).tolist() == list(range(100))
    assert slow_first.to_pandas()["id"].tolist() == list(range(100))
    assert _ids(slow_first.materialize().take(5)) == [0, 1, 2, 3, 4]  # materialized blocks kept in order
    dfs = [pd.DataFrame({"one": [3 * i, 3 * i + 1, 3 * i + 2]}) for i in range(4)]
    for batch, df in zip(rd.from_pandas(dfs).iter_batches(batch_size=None, batch_format="pandas"), dfs, strict=True):
        assert batch.equals(df)


def _first_files_last(batch):
    """Blocks of the first files sleep longest: their read tasks finish after later ones."""
    time.sleep(max(0.0, 0.3 - 0.1 * int(batch["one"][0])))
    return batch


def test_take_all_and_to_pandas_over_files_are_in_file_order(ctx, tmp_path):
    paths = _write_csvs(tmp_path / "in", ["a.csv", "b.csv", "c.csv", "d.csv"])
    ds = rd.read_csv(paths, override_num_blocks=4).map_batches(_first_files_last, batch_format="pandas")
    assert [r["one"] for r in ds.take_all()] == [0, 1, 2, 3]
    assert ds.to_pandas()["one"].tolist() == [0, 1, 2, 3]
    assert sorted(r["one"] for r in ds.iter_rows()) == [0, 1, 2, 3]  # streamed as they come


# -- iteration arguments -------------------------------------------------------------------------
def test_drop_last_and_the_prefetch_arguments(ctx):
    ds = rd.from_pandas([pd.DataFrame({"one": [3 * i, 3 * i + 1, 3 * i + 2]}) for i in range(4)])
    kept = list(ds.iter_batches(batch_size=5, drop_last=True, batch_format="pandas", prefetch_batches=2))
    assert [len(b) for b in kept] == [5, 5] and pd.concat(kept)["one"].tolist() == list(range(10))
    assert [len(b["one"]) for b in ds.iter_batches(batch_size=5, drop_last=False)] == [5, 5, 2]
    assert [len(b["one"]) for b in ds.iter_batches(batch_size=None, drop_last=True)] == [3, 3, 3, 3]
    assert [r["one"] for r in ds.iter_rows(prefetch_blocks=1)] == list(range(12))
    with pytest.raises(ValueError, match="prefetch_batches"):
        list(ds.iter_batches(prefetch_batches=-1))
    with pytest.raises(TypeError, match="drop_last"):
        list(ds.iter_batches(drop_last="yes"))
    shard = rd.range(10).iter_split(1)[0]  # a split's iterator takes the same arguments
    assert [len(b["id"]) for b in shard.iter_batches(batch_size=4, drop_last=True)] == [4, 4]
    torch_batches = list(ds.iter_torch_batches(batch_size=5, drop_last=True, device="cpu"))
    assert [len(b["one"]) for b in torch_batches] == [5, 5]


def _shuffled_ids(ds, **args) -> list[int]:
    return np.concatenate([b["id"] for b in ds.iter_batches(**args)] or [np.array([], int)]).tolist()


def test_local_shuffle_buffer_shuffles_within_the_buffer_and_repeats_with_a_seed(ctx):
    ds = rd.range(100, override_num_blocks=10)
    base = list(range(100))
    one, two = (_shuffled_ids(ds, batch_size=3, local_shuffle_buffer_size=25) for _ in range(2))
    assert one != base and two != base and one != two
    assert sorted(one) == base and sorted(two) == base
    seeded = [_shuffled_ids(ds, batch_size=3, local_shuffle_buffer_size=25, local_shuffle_seed=0) for _ in range(2)]
    assert seeded[0] == seeded[1] != base
    # a batch is cut only once 25 rows wait beyond it: the first is drawn from the first 30 rows (3 blocks)
    first = next(iter(ds.iter_batches(batch_size=3, local_shuffle_buffer_size=25)))["id"]
    assert len(first) == 3 and max(first) < 30
    dropped = _shuffled_ids(ds, batch_size=7, local_shuffle_buffer_size=21, drop_last=True)
    assert len(dropped) == 98 and set(dropped) <= set(base)
    with pytest.raises(ValueError, match="batch_size"):
        list(ds.iter_batches(batch_size=None, local_shuffle_buffer_size=10))
    assert _shuffled_ids(rd.from_items([]), batch_size=2, local_shuffle_buffer_size=10) == []


def test_iterator_gives_passes_that_can_be_repeated_like_rays(ctx):
    it = rd.range(20, override_num_blocks=4).iterator()
    batches = it.iter_batches(batch_size=8)
    for _ in range(2):  # an epoch loop over the same iterable: each pass is a new run
        assert np.concatenate([b["id"] for b in batches]).tolist() == list(range(20))
    assert [r["id"] for r in it.iter_rows()] == list(range(20))
    assert [len(b["id"]) for b in it.iter_torch_batches(batch_size=8, drop_last=True, device="cpu")] == [8, 8]
