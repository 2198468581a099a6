"""Tensor columns as Ray Data has them: NumPy arrays as row values going into and out of rows,
Ray's printed type for them, ``ArrowTensorType``, and ``.npy`` files through ``write_numpy``
and ``read_numpy``, on real local Spark, locally and on the S3 server.

Written from Ray Data's documentation ("Working with Tensors / NumPy", the ``read_numpy`` and
``write_numpy`` references), not from its tests.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.extensions import ArrowTensorArray, ArrowTensorType


def test_a_row_function_may_return_arrays_and_rows_give_them_back_as_arrays(ctx):
    ds = rd.range(4).map(lambda row: {"id": row["id"], "image": np.full((2, 3), row["id"], dtype=np.uint8)})
    rows = sorted(ds.take_all(), key=lambda row: row["id"])
    assert [row["image"].shape for row in rows] == [(2, 3)] * 4
    assert all(isinstance(row["image"], np.ndarray) and row["image"].dtype == np.uint8 for row in rows)
    np.testing.assert_array_equal(rows[3]["image"], np.full((2, 3), 3))
    assert ds.schema().types[1] == ArrowTensorType((2, 3), pa.uint8())
    assert "image   numpy.ndarray(shape=(2, 3), dtype=uint8)" in repr(ds.schema())
    assert ds.take_batch(4)["image"].shape == (4, 2, 3)


def test_a_row_function_gets_a_tensor_columns_values_as_writable_arrays(ctx):
    def double_in_place(row):
        row["data"] *= 2  # a read-only view of the block would raise here
        return row

    ds = rd.range_tensor(6, shape=(2, 2)).map(double_in_place).filter(lambda row: row["data"].sum() > 8)
    assert sorted(int(row["data"][0, 0]) for row in ds.take_all()) == [4, 6, 8, 10]
    materialized = rd.range_tensor(2, shape=(2, 2)).materialize()
    assert "schema={data: numpy.ndarray(shape=(2, 2), dtype=int64)}" in repr(materialized)
    assert [row["data"].tolist() for row in rd.range_tensor(2, shape=(2,)).iter_rows()] == [[0, 0], [1, 1]]


def test_from_items_of_arrays_makes_a_tensor_column_and_ragged_arrays_nested_lists(ctx):
    same = rd.from_items([{"a": np.zeros(3)}, {"a": np.ones(3)}], override_num_blocks=2)
    assert isinstance(same.schema().types[0], ArrowTensorType)
    assert [row["a"].tolist() for row in same.take_all()] == [[0.0] * 3, [1.0] * 3]
    ragged = rd.from_items([{"a": np.ones((2, 2))}, {"a": np.ones((1, 3))}]).take_all()
    assert [np.asarray(row["a"]).shape for row in ragged] == [(2, 2), (1, 3)]
    assert not isinstance(pa.list_(pa.int64()), ArrowTensorType)  # a list of any length is not a tensor
    ragged_batch = rd.from_numpy(np.array([np.ones((2, 2)), np.ones((3, 3))], dtype=object)).take_all()
    assert [np.asarray(row["data"]).shape for row in ragged_batch] == [(2, 2), (3, 3)]


def test_arrow_tensor_type_and_array_build_what_a_tensor_column_holds(ctx):
    column = ArrowTensorArray.from_numpy(np.arange(12).reshape(3, 2, 2))
    assert column.type == ArrowTensorType((2, 2), pa.int64())
    ds = rd.from_arrow(pa.table({"t": column}))
    np.testing.assert_array_equal(ds.take_batch(3)["t"], np.arange(12).reshape(3, 2, 2))
    with pytest.raises(ValueError, match="shape"):
        ArrowTensorType((), pa.int64())


@pytest.mark.parametrize("where", ["local", "s3"])
def test_write_numpy_then_read_numpy_gives_the_same_arrays(ctx, tmp_path, request, where):
    root = str(tmp_path / "out") if where == "local" else request.getfixturevalue("s3_bucket") + "/out"
    source = rd.range_tensor(10, shape=(2, 3), override_num_blocks=2)
    result = source.write_numpy(root, column="data")
    assert sum(record.rows for record in result.committed.values()) == 10
    assert all(name.endswith(".npy") for record in result.committed.values() for name in record.files)

    ds = rd.read_numpy(root)
    assert ds.schema().types == [ArrowTensorType((2, 3), pa.int64())]
    rows = sorted(ds.take_all(), key=lambda row: int(row["data"][0, 0]))
    assert [int(row["data"][0, 0]) for row in rows] == list(range(10))
    assert all(row["data"].shape == (2, 3) for row in rows)


def test_read_numpy_reads_only_npy_files_and_refuses_pickles_unless_allowed(ctx, tmp_path):
    np.save(tmp_path / "ids.npy", np.arange(5))
    (tmp_path / "notes.txt").write_text("not an array")
    assert sorted(row["data"] for row in rd.read_numpy(str(tmp_path)).take_all()) == [0, 1, 2, 3, 4]

    objects = tmp_path / "objects"
    objects.mkdir()
    np.save(objects / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(rd.PartitionsFailedError, match=r"o\.npy.*allow_pickle=True"):
        rd.read_numpy(str(objects)).take_all()
    assert rd.read_numpy(str(objects), allow_pickle=True).take_all() == [{"data": {"a": 1}}]
    with pytest.raises(TypeError, match="numpy.load"):
        rd.read_numpy(str(objects), pickle=True)


def test_write_numpy_names_a_missing_column(ctx, tmp_path):
    with pytest.raises(rd.PartitionsFailedError, match=r"write_numpy\(column='nope'\): no such column"):
        rd.range(3).write_numpy(str(tmp_path / "out"), column="nope")
    with pytest.raises(TypeError, match="column"):
        rd.range(3).write_numpy(str(tmp_path / "out"), column=3)
    assert not any(name.endswith(".npy") for _, _, names in os.walk(tmp_path) for name in names)


def test_read_numpy_from_s3_with_a_filesystem(ctx, s3_bucket):
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    with fs.open_output_stream(f"{bucket}/np/a.npy") as out:
        np.save(out, np.arange(6).reshape(3, 2))
    ds = rd.read_numpy(f"{bucket}/np", filesystem=fs)
    assert [row["data"].tolist() for row in ds.take_all()] == [[0, 1], [2, 3], [4, 5]]
