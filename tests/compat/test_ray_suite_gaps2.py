"""What a second rerun of Ray Data's own tests (test_map.py, test_consumption.py, test_parquet.py,
test_json.py, test_csv.py, test_file_datasink.py) against the engine showed missing: Ray's save
modes ``SaveMode.ERROR``/``SaveMode.IGNORE`` deciding by whether the output path exists (an empty
directory too), ``select_columns`` on blocks cut into one-row batches, a repartition over blocks typed
int64 in some and float64 in others, the error for a function that cannot be pickled, and
``ExecutionOptions.resource_limits`` with ``ExecutionResources``.

Written from Ray Data's documented behaviour and its implementation's rules, on real local Spark.
"""

from __future__ import annotations

import os
import threading
import time

import pandas as pd
import pyarrow as pa
import pytest

import airflow_streambatch.engine as rd
from airflow_streambatch.engine import ExecutionResources, SaveMode
from airflow_streambatch.engine.output.target import OutputTarget

_WRITES = ("write_parquet", "write_json", "write_csv")


def _fail_if_run(row):
    raise AssertionError("a skipped write ran its pipeline")


# -- save modes -----------------------------------------------------------------------------------
def test_save_mode_is_rays_string_enum():
    assert [m.value for m in (SaveMode.APPEND, SaveMode.OVERWRITE, SaveMode.IGNORE, SaveMode.ERROR)] == \
        ["append", "overwrite", "ignore", "error"]
    assert SaveMode.ERROR == "error" and isinstance(SaveMode.IGNORE, str)


@pytest.mark.parametrize("write", _WRITES)
def test_error_mode_refuses_an_existing_empty_directory_before_anything_runs(ctx, tmp_path, write):
    out = tmp_path / "existing"
    out.mkdir()  # Ray checks whether the path exists: an empty directory counts
    ds = rd.range(3).map(_fail_if_run)
    with pytest.raises(ValueError, match="already exists") as refused:
        getattr(ds, write)(str(out), mode=SaveMode.ERROR)
    assert isinstance(refused.value, FileExistsError)  # this engine's own type, as before
    assert str(out) in str(refused.value) and "mode='ignore'" in str(refused.value)
    assert os.listdir(out) == []  # no lease, no staging left behind


@pytest.mark.parametrize("write", _WRITES)
def test_error_mode_writes_a_new_path_then_refuses_it(ctx, tmp_path, write):
    out = tmp_path / "new"
    ds = rd.range(4, override_num_blocks=2)
    result = getattr(ds, write)(str(out), mode="error")
    assert sorted(result.committed) == [0, 1]
    with pytest.raises(ValueError, match="already exists"):
        getattr(ds, write)(str(out), mode="error")


@pytest.mark.parametrize("write", _WRITES)
def test_ignore_mode_skips_an_existing_empty_directory_and_leaves_it_empty(ctx, tmp_path, write):
    out = tmp_path / "existing"
    out.mkdir()
    result = getattr(rd.range(5).map(_fail_if_run), write)(str(out), mode=SaveMode.IGNORE)
    assert result.committed == {} and result.skipped == {}
    assert os.listdir(out) == []  # as Ray's test_ignore_save_mode_reports_zero_rows expects


def test_ignore_mode_writes_a_path_that_does_not_exist(ctx, tmp_path):
    out = tmp_path / "absent"
    result = rd.range(6, override_num_blocks=2).write_parquet(str(out), mode=SaveMode.IGNORE)
    assert sorted(result.committed) == [0, 1]
    assert sorted(rd.read_parquet(str(out)).to_pandas()["id"]) == list(range(6))
    again = rd.range(6).map(_fail_if_run).write_parquet(str(out), mode="ignore")
    assert again.committed == {} and sorted(again.skipped) == [0, 1]


def test_save_modes_on_a_target_the_caller_opened_look_at_the_path_before_it_was_opened(ctx, tmp_path):
    out = tmp_path / "existing"
    out.mkdir()
    with OutputTarget.open(str(out)) as target:  # opening takes the lease: the directory now holds _lease
        with pytest.raises(ValueError, match="already exists"):
            rd.range(2).write_csv(target, mode=SaveMode.ERROR)
    fresh = tmp_path / "fresh"
    with OutputTarget.open(str(fresh)) as target:  # did not exist when opened: an error-mode write goes on
        assert sorted(rd.range(2, override_num_blocks=1).write_csv(target, mode=SaveMode.ERROR).committed) == [0]


def test_save_mode_append_and_overwrite_members_work_as_their_strings(ctx, tmp_path):
    out = str(tmp_path / "out")
    ds = rd.range(4, override_num_blocks=2)
    ds.write_parquet(out, mode=SaveMode.APPEND)
    ds.write_parquet(out, mode=SaveMode.APPEND)
    assert len(rd.read_parquet(out).take_all()) == 8
    ds.write_parquet(out, mode=SaveMode.OVERWRITE)
    assert sorted(rd.read_parquet(out).to_pandas()["id"]) == [0, 1, 2, 3]


# -- select_columns -------------------------------------------------------------------------------
def test_select_columns_on_one_row_batches_keeps_rows_without_columns_and_repeated_names(ctx):
    df = pd.DataFrame({"col1": [1, 2, 3], "col2": [2, 3, 4], "col3": [3, 4, 5]})
    one_row_batches = rd.from_pandas(df).map_batches(lambda t: t, batch_size=1, batch_format="pyarrow")
    for ds in (rd.from_pandas(df), one_row_batches):
        assert ds.select_columns(cols=[]).take(1) == [{}]
        assert ds.select_columns(cols=[]).take_all() == [{}, {}, {}]
        assert ds.select_columns(cols=[]).count() == 3
        assert ds.select_columns(cols=["col2", "col1"]).take(1) == [{"col2": 2, "col1": 1}]
        assert ds.select_columns(cols=["col1", "col2", "col2"]).schema().names == ["col1", "col2", "col2"]


# -- repartition over int64 and float64 blocks -----------------------------------------------------
def _mixed_blocks():
    """Two blocks of column x: int64 in the first, float64 in the second."""
    return rd.from_arrow([pa.table({"x": [1, 2]}), pa.table({"x": [0.5, 1.5]})])


def test_repartition_promotes_int64_and_float64_blocks_to_float64(ctx):
    ds = _mixed_blocks().repartition(1)
    rows = ds.take_all()
    assert sorted(r["x"] for r in rows) == [0.5, 1.0, 1.5, 2.0]
    assert ds.schema().types == [pa.float64()]
    batches = list(ds.iter_batches(batch_size=None, batch_format="pyarrow"))
    assert len(batches) == 1 and batches[0].schema.field("x").type == pa.float64()


def test_repartition_fills_a_column_some_blocks_lack_with_nulls(ctx):
    ds = rd.from_arrow([pa.table({"x": [1], "y": ["a"]}), pa.table({"x": [2.5]})]).repartition(1)
    rows = sorted(ds.take_all(), key=lambda r: r["x"])
    assert rows == [{"x": 1.0, "y": "a"}, {"x": 2.5, "y": None}]


def test_random_shuffle_promotes_mixed_numeric_blocks_too(ctx):
    assert sorted(r["x"] for r in _mixed_blocks().random_shuffle(seed=1).take_all()) == [0.5, 1.0, 1.5, 2.0]


def test_a_map_that_returns_different_types_per_batch_is_still_refused_naming_it(ctx):
    def flip(batch):
        return {"x": batch["id"] if batch["id"][0] == 0 else batch["id"].astype("float64")}

    with pytest.raises(Exception, match="different schemas in one task"):
        rd.range(4, override_num_blocks=1).map_batches(flip, batch_size=2).take_all()


# -- a function that cannot be pickled -------------------------------------------------------------
def test_a_function_that_cannot_be_pickled_raises_rays_type_error_naming_operator_and_variable(ctx):
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r".*was found to be non-serializable.*") as failed:
        rd.range(10).map_batches(lambda _: lock).take(1)
    message = str(failed.value)
    assert "MapBatches(<lambda>)" in message and "'lock'" in message and "_thread.lock" in message


def test_a_class_whose_constructor_argument_cannot_be_pickled_names_the_argument(ctx):
    class Keep:
        def __init__(self, handle):
            self.handle = handle

        def __call__(self, batch):
            return batch

    with pytest.raises(TypeError, match="was found to be non-serializable") as failed:
        rd.range(4).map_batches(Keep, fn_constructor_args=(threading.Lock(),), concurrency=1).take_all()
    assert "MapBatches(Keep)" in str(failed.value) and "fn_constructor_args" in str(failed.value)


# -- ExecutionOptions.resource_limits -------------------------------------------------------------
def test_resource_limits_default_to_no_limit_and_take_rays_fields(ctx):
    limits = ctx.execution_options.resource_limits
    assert (limits.cpu, limits.gpu, limits.object_store_memory, limits.memory) == (None, None, None, None)
    given = ExecutionResources(cpu=2, gpu=0, object_store_memory=1e9, memory=2e9)
    assert (given.cpu, given.gpu, given.object_store_memory, given.memory) == (2, 0, 1e9, 2e9)
    with pytest.raises(ValueError, match="ExecutionResources.cpu must be a number >= 0 or None"):
        ExecutionResources(cpu=-1)
    with pytest.raises(ValueError, match="resource_limits must be an ExecutionResources"):
        ctx.execution_options.resource_limits = "1 CPU"
    ctx.execution_options.resource_limits = {"cpu": 1}  # a DAG's data_context gives it as JSON
    assert ctx.execution_options.resource_limits == ExecutionResources(cpu=1)


def test_a_cpu_limit_caps_the_cpu_slots_so_tasks_run_one_at_a_time(ctx, tmp_path):
    ctx.execution_options.resource_limits = ExecutionResources(cpu=1)
    marks = tmp_path / "marks"
    marks.mkdir()

    def record(batch):
        start = time.time()
        time.sleep(0.4)
        (marks / f"{batch['id'][0]}").write_text(f"{start} {time.time()}")
        return batch

    ds = rd.range(4, override_num_blocks=4).map_batches(record)
    assert sorted(r["id"] for r in ds.take_all()) == [0, 1, 2, 3]
    spans = sorted(tuple(map(float, (marks / name).read_text().split())) for name in os.listdir(marks))
    assert len(spans) == 4 and all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:]))
    assert ds._last_executor.parts.launcher.pool.totals["CPU"] == 1


def test_limits_set_field_by_field_map_cpu_to_slots_and_object_store_memory_to_the_memory_budget(ctx):
    ctx.execution_options.resource_limits.cpu = 2  # Ray's tests set the fields one by one
    ctx.execution_options.resource_limits.object_store_memory = 256 * 1024 * 1024
    ds = rd.range(8, override_num_blocks=4)
    assert len(ds.take_all()) == 8
    executor = ds._last_executor
    assert executor.parts.launcher.pool.totals["CPU"] == 2
    assert executor.parts.memory.limit == 256 * 1024 * 1024 == executor.ctx.memory_limit
    assert ctx.memory_limit != 256 * 1024 * 1024  # the setting itself is left as it was


def test_a_limit_above_what_exists_changes_nothing_and_copy_keeps_the_limits(ctx):
    ctx.execution_options.resource_limits = ExecutionResources(cpu=1000, object_store_memory=1 << 60)
    ds = rd.range(4, override_num_blocks=2)
    assert len(ds.take_all()) == 4
    assert ds._last_executor.parts.launcher.pool.totals["CPU"] == ctx.resources["CPU"]
    assert ds._last_executor.parts.memory.limit == ctx.memory_limit
    copied = ctx.copy(execution_options={"preserve_order": True, "resource_limits": ExecutionResources(cpu=3)})
    assert copied.execution_options.resource_limits.cpu == 3
    assert ctx.copy().execution_options.resource_limits.cpu == 1000
    assert ctx.copy().execution_options.resource_limits is not ctx.execution_options.resource_limits
