"""What a rerun of Ray Data's own reads/map/consumption tests against the engine showed missing
(issue 32): arguments Ray programs written before its renames pass (``parallelism=``,
``override_num_blocks=`` on ``from_pandas``/``from_arrow``), empty column lists, NumPy integers as
batch sizes, ``range_tensor`` and arrays of more than two dimensions, ``from_items`` rows whose
values are sometimes None, and Ray's error types (a read's own error, "Failed to read CSV file",
a batch function's wrong return value as ``ValueError``).

Written from Ray Data's API reference and documented behaviour, never from its tests, on real
local Spark, and the S3 server for the reads.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as rd


def _ids(rows) -> list[int]:
    return [row["id"] for row in rows]


# -- parallelism= -------------------------------------------------------------------------------
def test_parallelism_sets_the_block_count_of_range_and_from_items_with_rays_warning(ctx):
    with pytest.warns(DeprecationWarning, match="parallelism.*override_num_blocks"):
        ds = rd.range(10, parallelism=4)
    assert ds.num_blocks() == 4 and _ids(ds.take_all()) == list(range(10))

    records = [{"a": i} for i in range(7)]
    with pytest.warns(DeprecationWarning):
        items = rd.from_items(records, parallelism=3)
    assert items.num_blocks() == 3 and items.take_all() == records

    with pytest.warns(DeprecationWarning):  # a value given wins over override_num_blocks, as in Ray
        assert rd.range(10, override_num_blocks=2, parallelism=5).num_blocks() == 5


def test_parallelism_default_and_none_leave_override_num_blocks_alone_and_warn_nothing(ctx):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rd.range(10, parallelism=-1, override_num_blocks=2).num_blocks() == 2
        assert rd.from_items([1, 2, 3], parallelism=None, override_num_blocks=3).num_blocks() == 3


def test_parallelism_is_checked_naming_the_function(ctx):
    with pytest.raises(ValueError, match="range: parallelism must be a positive integer"):
        rd.range(10, parallelism=0)
    with pytest.raises(ValueError, match="read_csv: parallelism"):
        rd.read_csv("unused.csv", parallelism="2")


def test_parallelism_on_file_reads_from_the_s3_server(ctx, s3_bucket):
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    for i in range(3):
        with fs.open_output_stream(f"{bucket}/csv/part{i}.csv") as out:
            out.write(f"id\n{2 * i}\n{2 * i + 1}\n".encode())
        pq.write_table(pa.table({"id": [i]}), f"{bucket}/pq/part{i}.parquet", filesystem=fs)
    with pytest.warns(DeprecationWarning):
        csv = rd.read_csv(f"{s3_bucket}/csv", parallelism=3)
    with pytest.warns(DeprecationWarning):
        parquet = rd.read_parquet(f"{s3_bucket}/pq", parallelism=3)
    assert sorted(_ids(csv.take_all())) == list(range(6)) and csv.num_blocks() == 3
    assert sorted(_ids(parquet.take_all())) == [0, 1, 2]


# -- override_num_blocks on from_pandas / from_arrow ---------------------------------------------
def test_from_pandas_and_from_arrow_cut_the_rows_into_override_num_blocks_in_order(ctx):
    frames = [pd.DataFrame({"id": range(0, 6)}), pd.DataFrame({"id": range(6, 10)})]
    ds = rd.from_pandas(frames, override_num_blocks=3)
    assert ds.num_blocks() == 3
    assert [len(batch["id"]) for batch in ds.iter_batches(batch_size=None)] == [4, 3, 3]  # array_split's sizes
    assert _ids(ds.take_all()) == list(range(10))

    table = pa.table({"id": list(range(5))})
    assert rd.from_arrow(table, override_num_blocks=2).to_pandas()["id"].tolist() == list(range(5))
    assert rd.from_arrow([table], override_num_blocks=7).count() == 5  # more blocks than rows: some empty
    assert rd.from_pandas(frames).num_blocks() == 2  # without it: one block per frame, as before
    with pytest.raises(ValueError, match="from_pandas: override_num_blocks"):
        rd.from_pandas(frames, override_num_blocks=0)


def test_len_of_a_dataset_is_rays_attribute_error_and_a_type_error(ctx):
    with pytest.raises(AttributeError, match=r"call ds.count\(\)") as failed:
        len(rd.range(1))
    assert isinstance(failed.value, TypeError)


# -- columns and batch sizes ---------------------------------------------------------------------
def test_select_and_drop_columns_take_an_empty_list_and_repeated_names(ctx):
    ds = rd.from_pandas(pd.DataFrame({"a": [1, 2], "b": [3, 4], "c": [5, 6]}))
    assert ds.select_columns([]).take_all() == [{}, {}]
    assert ds.drop_columns([]).take(1) == [{"a": 1, "b": 3, "c": 5}]
    assert ds.drop_columns(["a", "a", "b", "a"]).take_all() == [{"c": 5}, {"c": 6}]
    with pytest.raises(TypeError, match="select_columns: give a column name or a list of names"):
        ds.select_columns(None)


def test_iter_batches_takes_numpy_integer_batch_sizes(ctx):
    sizes = [len(b["id"]) for b in rd.range(10).iter_batches(batch_size=np.int64(4), drop_last=False)]
    assert sizes == [4, 4, 2]


# -- reading a file that is not CSV --------------------------------------------------------------
def _csv_and_parquet(tmp_path) -> None:
    df = pd.DataFrame({"one": [1, 2, 3], "two": ["a", "b", "c"]})
    df.to_csv(tmp_path / "a.csv", index=False)
    pq.write_table(pa.Table.from_pandas(df), tmp_path / "b.parquet")


def test_read_csv_of_only_a_file_that_is_not_csv_raises_rays_value_error_naming_it(ctx, tmp_path):
    _csv_and_parquet(tmp_path)
    with pytest.raises(ValueError, match="Failed to read CSV file") as alone:
        rd.read_csv(tmp_path / "b.parquet").materialize()
    assert isinstance(alone.value, OSError) and "b.parquet" in str(alone.value)


def test_read_csv_of_a_directory_with_a_parquet_file_fails_its_read_task_with_rays_error(ctx, tmp_path):
    _csv_and_parquet(tmp_path)
    assert rd.read_csv(tmp_path, file_extensions=["csv"]).count() == 3
    with pytest.raises(ValueError, match=r"Failed to read CSV file: .*b\.parquet"):  # in its own read task
        rd.read_csv(tmp_path).materialize()


def test_a_read_error_keeps_the_readers_exception_type_locally_and_on_s3(ctx, tmp_path, s3_bucket):
    """As Ray raises a read task's own error, a JSON file that does not parse is a ValueError
    (pyarrow's or json's) as well as the OSError naming the file, wherever the file is."""
    (tmp_path / "bad.json").write_text('{"a": 1}\n{oops\n')
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    with fs.open_output_stream(f"{bucket}/bad.json") as out:
        out.write(b'{"a": 1}\n{oops\n')
    for path in (str(tmp_path / "bad.json"), f"{s3_bucket}/bad.json"):
        with pytest.raises(ValueError, match="bad.json") as failed:
            rd.read_json(path).materialize()
        assert isinstance(failed.value, OSError)


# -- map_batches / add_column return values ---------------------------------------------------------
def test_a_batch_function_returning_a_non_batch_is_rays_value_error(ctx):
    with pytest.raises(ValueError, match="returned int") as failed:
        rd.range(3).map_batches(lambda batch: 1).take_all()
    assert isinstance(failed.value, TypeError)  # what it was here before, kept


def test_add_column_gives_every_row_a_scalar_the_function_returns(ctx):
    assert rd.range(3).add_column("foo", lambda batch: 7).take_all() == [
        {"id": 0, "foo": 7}, {"id": 1, "foo": 7}, {"id": 2, "foo": 7}]
    with pytest.raises(ValueError, match="add_column\\('id'\\): fn must be a function of a batch, got int"):
        rd.range(3).add_column("id", 0)


# -- range_tensor and arrays of more than two dimensions ------------------------------------------
def test_range_tensor_rows_hold_arrays_of_the_shape_filled_with_the_index(ctx):
    ds = rd.range_tensor(10, override_num_blocks=2)
    assert ds.num_blocks() == 2 and ds.count() == 10
    np.testing.assert_array_equal(ds.take_batch(3)["data"], np.array([[0], [1], [2]]))
    square = rd.range_tensor(4, shape=(2, 3)).take_batch(4)["data"]
    assert square.shape == (4, 2, 3) and (square[3] == 3).all()
    assert isinstance(next(iter(ds.iter_batches(batch_format="pandas"))), pd.DataFrame)
    with pytest.raises(ValueError, match="range_tensor: shape must be"):
        rd.range_tensor(3, shape=(0,))


def test_map_batches_and_from_numpy_keep_arrays_of_three_dimensions(ctx):
    cube = np.arange(24).reshape(2, 3, 4)
    np.testing.assert_array_equal(rd.from_numpy(cube).take_batch(2)["data"], cube)
    doubled = rd.range(2).map_batches(lambda b: {"x": np.ones((len(b["id"]), 2, 2)) * b["id"][:, None, None]})
    np.testing.assert_array_equal(doubled.take_batch(2)["x"], np.array([np.zeros((2, 2)), np.ones((2, 2))]))


# -- JSON: small block sizes, lines of arrays ---------------------------------------------------------
def test_read_json_grows_a_block_size_smaller_than_a_row_and_reads_lines_of_arrays(ctx, tmp_path, s3_bucket):
    import pyarrow.json as pajson

    rows = [{"one": i, "two": "x" * 300} for i in range(3)]
    pd.DataFrame(rows).to_json(tmp_path / "rows.json", orient="records", lines=True)
    options = pajson.ReadOptions(block_size=64)
    assert rd.read_json(tmp_path / "rows.json", read_options=options).take_all() == rows
    assert options.block_size == 64  # the caller's options are left as given

    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    with fs.open_output_stream(f"{bucket}/arrays.jsonl") as out:
        out.write(b'["ray", "rocks", "hello"]\n["oh", "no"]\n')
    assert rd.read_json(f"{s3_bucket}/arrays.jsonl", lines=True).take_all() == [
        {"0": "ray", "1": "rocks", "2": "hello"}, {"0": "oh", "1": "no", "2": None}]


# -- from_items with None values -------------------------------------------------------------------
def test_from_items_rows_with_none_values_join_the_other_rows_blocks(ctx):
    """One item a block: the block of {"A": None} types A as the others do, so a repartition
    joins them and the aggregates skip the null, as in Ray."""
    rows = [{"A": x} for x in range(10)] + [{"A": None}]
    ds = rd.from_items(rows, override_num_blocks=len(rows)).repartition(3)
    assert ds.min("A") == 0 and ds.max("A") == 9 and ds.mean("A") == 4.5
    assert ds.min("A", ignore_nulls=False) is None
    assert sorted(ds.take_all(), key=lambda r: (r["A"] is None, r["A"])) == sorted(
        rows, key=lambda r: (r["A"] is None, r["A"]))


def test_aggregates_widen_int_and_float_blocks_of_one_task(ctx):
    """A task whose blocks type a column int64 and float64 (pandas turns ints with a None into
    floats) aggregates them together, as pandas' concat of Ray's blocks widens them; before, the
    Ray suite's global min/max/mean of such blocks failed with "Unable to merge" when one task got
    both. The task's own functions, run on the two blocks as a task hands them over."""
    from airflow_streambatch.engine.aggregate import Max, Mean
    from airflow_streambatch.engine.worker.sorting import aggregate_groups, partial_aggregate

    blocks = [pa.table({"A": [1, 2, 3]}), pa.table({"A": [4.5, None]})]
    partials = list(partial_aggregate(iter(blocks), (), (Max("A"), Mean("A")), "Aggregate"))
    merged = list(aggregate_groups(iter(partials), (), (Max("A"), Mean("A")), "Aggregate", merge=True))
    assert merged[0].to_pylist() == [{"max(A)": 4.5, "mean(A)": 2.625}]
    direct = list(aggregate_groups(iter(blocks), (), (Max("A"),), "Aggregate"))
    assert direct[0].to_pylist() == [{"max(A)": 4.5}]

    rows = [{"A": x} for x in range(100)] + [{"A": None}]  # the Ray suite's shape, on the engine
    ds = rd.from_items(rows).repartition(30).map_batches(lambda b: b, batch_size=None, batch_format="pandas")
    assert ds.max("A") == 99 and ds.mean("A") == 49.5
