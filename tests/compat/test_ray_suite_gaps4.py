"""What a fourth rerun of Ray Data's own tests against the engine showed missing: Ray's
``DataContext`` knobs that programs read or set (``use_arrow_tensor_v2``,
``use_streaming_executor``, ``actor_prefetcher_enabled``, ``decoding_size_estimation``),
``ExecutionResources.copy(cpu=...)``, ``serialize_lineage``/``deserialize_lineage``,
``size_bytes()`` of an empty dataset, ``from_*`` returning a ``MaterializedDataset``,
``stats()`` before a run, Ray's warning for a parallelism far above the CPU slots,
``map_batches(max_task_retries=...)`` and Ray's wording for ``concurrency=(min, max)`` with a
function.

Written from Ray Data's documented behaviour and its implementation's rules, on real local Spark.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as rd
from airflow_streambatch.engine import DataContext, ExecutionResources, MaterializedDataset
from airflow_streambatch.engine.errors import PartitionsFailedError
from airflow_streambatch.engine.execution.operators.read import warn_if_too_parallel
from airflow_streambatch.engine.extensions import ArrowTensorType, ArrowTensorTypeV2


# -- DataContext knobs of Ray ---------------------------------------------------------------------
def test_rays_context_knobs_have_rays_defaults():
    ctx = DataContext()
    assert (ctx.use_arrow_tensor_v2, ctx.use_streaming_executor, ctx.actor_prefetcher_enabled,
            ctx.decoding_size_estimation) == (True, True, False, True)


@pytest.mark.parametrize("name", ["use_arrow_tensor_v2", "actor_prefetcher_enabled", "decoding_size_estimation"])
def test_rays_boolean_knobs_take_either_value_and_refuse_others(name):
    ctx = DataContext()
    for value in (False, True):
        setattr(ctx, name, value)
        assert getattr(ctx, name) is value
    with pytest.raises(ValueError, match=f"DataContext.{name} must be True or False"):
        setattr(ctx, name, "yes")
    assert DataContext.check_settings({name: False}) == {name: False}


def test_use_streaming_executor_refuses_the_bulk_executor():
    ctx = DataContext()
    ctx.use_streaming_executor = True
    with pytest.raises(ValueError, match="always streaming"):
        ctx.use_streaming_executor = False
    with pytest.raises(ValueError, match=r"data_context\['use_streaming_executor'\] must be True"):
        DataContext.check_settings({"use_streaming_executor": False})


def test_tensors_read_the_same_with_either_tensor_version(ctx, tmp_path):
    path = str(tmp_path / "t.npy")
    np.save(path, np.arange(6).reshape(3, 2))
    schemas = []
    for v2 in (True, False):
        ctx.use_arrow_tensor_v2 = v2
        schemas.append(rd.read_numpy(path).schema())
    assert schemas[0] == schemas[1]
    assert ArrowTensorTypeV2 is ArrowTensorType


# -- ExecutionResources.copy(**changes) ------------------------------------------------------------
def test_execution_resources_copy_takes_field_changes():
    limits = ExecutionResources(cpu=4, object_store_memory=1 << 30)
    copied = limits.copy(cpu=1)
    assert (copied.cpu, copied.object_store_memory) == (1, 1 << 30)
    assert limits.cpu == 4 and limits.copy() == limits and limits.copy() is not limits
    assert limits.copy(object_store_memory=5).object_store_memory == 5
    with pytest.raises(ValueError, match="unknown field"):
        limits.copy(cpus=1)
    with pytest.raises(ValueError, match="ExecutionResources.cpu must be a number"):
        limits.copy(cpu=-1)


def test_a_run_under_a_copied_limit(ctx):
    ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(cpu=1)
    assert sorted(r["id"] for r in rd.range(20, override_num_blocks=4).take_all()) == list(range(20))


# -- serialize_lineage / deserialize_lineage ------------------------------------------------------
def _plus_one(row):
    return {"id": row["id"] + 1}


def test_lineage_of_a_read_roundtrips_without_its_data(ctx, tmp_path):
    path = str(tmp_path / "in.parquet")
    pq.write_table(pa.table({"id": list(range(10))}), path)
    ds = rd.read_parquet(path).map(_plus_one).map(_plus_one)
    assert ds.has_serializable_lineage()
    blob = ds.serialize_lineage()
    assert isinstance(blob, bytes) and len(blob) < 200_000
    rebuilt = rd.Dataset.deserialize_lineage(blob)
    assert sorted(r["id"] for r in rebuilt.take_all()) == list(range(2, 12))
    # the plan, not the data: the file's new rows show up in the rebuilt dataset
    pq.write_table(pa.table({"id": [100]}), path)
    assert [r["id"] for r in rd.Dataset.deserialize_lineage(blob).take_all()] == [102]


def test_lineage_of_a_union_of_bare_reads_roundtrips(ctx):
    blob = rd.range(10).union(rd.range(20)).serialize_lineage()
    assert sorted(r["id"] for r in rd.Dataset.deserialize_lineage(blob).take_all()) == \
        sorted(list(range(10)) + list(range(20)))


@pytest.mark.parametrize("build", [
    lambda: rd.from_items(list(range(10))).map(lambda r: r),
    lambda: rd.from_pandas(pd.DataFrame({"a": [1, 2]})),
    lambda: rd.from_numpy(np.arange(4)),
    lambda: rd.from_items([1]).union(rd.from_items([2])),
    lambda: rd.range(10).map(_plus_one).union(rd.range(20).map(_plus_one)),
    lambda: rd.range(10).materialize(),
    lambda: rd.range(3).zip(rd.range(3)),
], ids=["from_items", "from_pandas", "from_numpy", "union_in_memory", "union_after_map", "materialized", "zip"])
def test_lineage_of_in_memory_or_existing_data_is_refused(ctx, build):
    ds = build()
    assert not ds.has_serializable_lineage()
    with pytest.raises(ValueError, match="Lineage-based serialization is not supported"):
        ds.serialize_lineage()


def test_deserialize_lineage_refuses_other_bytes():
    import pickle

    with pytest.raises(ValueError, match="not made by Dataset.serialize_lineage"):
        rd.Dataset.deserialize_lineage(pickle.dumps({"x": 1}))
    with pytest.raises(TypeError, match="expects the bytes"):
        rd.Dataset.deserialize_lineage("text")


# -- size_bytes of an empty dataset ---------------------------------------------------------------
def test_size_bytes_of_an_empty_dataset_is_none(ctx):
    assert rd.range(0).size_bytes() is None
    assert rd.range(5).filter(lambda r: r["id"] > 10).size_bytes() is None
    assert rd.range(5).size_bytes() > 0


# -- from_* are materialized ----------------------------------------------------------------------
def test_from_pandas_is_a_materialized_dataset_with_known_blocks_rows_and_schema(ctx):
    df = pd.DataFrame({"1": np.random.rand(10), "a": np.random.rand(10)})
    ds = rd.from_pandas(df)
    assert isinstance(ds, MaterializedDataset)
    assert str(ds) == "MaterializedDataset(num_blocks=1, num_rows=10, schema={1: float64, a: float64})"
    with pytest.raises(ValueError, match="column names must be strings"):
        rd.from_pandas(pd.DataFrame({1: [1.0], "a": [2.0]}))
    two = rd.from_pandas([df, df])
    assert two.num_blocks() == 2 and two.count() == 20
    assert isinstance(rd.from_arrow(pa.table({"x": [1]})), MaterializedDataset)
    assert isinstance(rd.from_numpy(np.arange(3)), MaterializedDataset)
    # a transform on it is a lazy Dataset again; materialize() writes the blocks to files
    assert type(ds.map(lambda r: r)) is rd.Dataset
    written = ds.materialize()
    assert isinstance(written, MaterializedDataset) and written.num_blocks() == 1
    assert written.to_pandas()["a"].tolist() == df["a"].tolist()


def test_stats_before_a_run_names_the_plans_operators(ctx):
    ds = rd.from_numpy([np.arange(4), np.arange(4, 8)])
    assert "FromNumpy" in ds.stats() and "not been executed" in ds.stats()
    mapped = rd.range(3).map(_plus_one)
    assert "ReadRange" in mapped.stats() and "Map(_plus_one)" in mapped.stats()
    mapped.take_all()
    assert "not been executed" not in mapped.stats()


# -- the warning for a parallelism far above the CPU slots ----------------------------------------
def test_warning_for_parallelism_over_4x_cpu_slots(caplog):
    with caplog.at_level(logging.WARNING):
        warn_if_too_parallel(5000, 5000, 8)
    assert "The requested parallelism of 5000 is more than 4x the number of available CPU slots in the " \
           "cluster" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        warn_if_too_parallel(None, 6000, 8)  # the engine's own choice: no warning
        warn_if_too_parallel(4999, 4999, 8)  # under Ray's floor of 5000 tasks
        warn_if_too_parallel(5000, 5000, 1250)  # not more than 4x the slots
    assert "requested parallelism" not in caplog.text


def test_a_read_with_too_many_blocks_warns_when_it_runs(ctx, caplog):
    with caplog.at_level(logging.WARNING):
        assert rd.range(5000, override_num_blocks=5000).count() == 5000  # metadata: nothing runs, no warning
        assert "requested parallelism" not in caplog.text
        assert rd.range(5000, override_num_blocks=5000).materialize().count() == 5000
    assert "The requested parallelism of 5000 is more than 4x" in caplog.text


# -- map_batches(max_task_retries=...) ------------------------------------------------------------
def _flaky(marker_dir: str, failures: int):
    """A batch function that raises on its first ``failures`` calls (counted in files: the calls
    run in Spark's Python workers), then passes its batch on."""

    def fn(batch):
        os.makedirs(marker_dir, exist_ok=True)
        calls = len(os.listdir(marker_dir))
        with open(os.path.join(marker_dir, str(calls)), "w"):
            pass
        if calls < failures:
            raise RuntimeError(f"flaky call {calls}")
        return batch

    return fn


def test_map_batches_max_task_retries_overrides_the_context(ctx, tmp_path):
    ctx.max_task_retries = 0
    with pytest.raises(PartitionsFailedError):
        rd.range(4, override_num_blocks=1).map_batches(_flaky(str(tmp_path / "a"), 2)).take_all()
    ds = rd.range(4, override_num_blocks=1).map_batches(_flaky(str(tmp_path / "b"), 2), max_task_retries=3)
    assert sorted(r["id"] for r in ds.take_all()) == [0, 1, 2, 3]
    ds = rd.range(4, override_num_blocks=1).map_batches(_flaky(str(tmp_path / "c"), 4), max_task_retries=-1)
    assert sorted(r["id"] for r in ds.take_all()) == [0, 1, 2, 3]
    ds = rd.range(4, override_num_blocks=1).map(lambda r: r, max_retries=1)
    assert len(ds.take_all()) == 4


def test_max_task_retries_checks_its_value_and_max_restarts_is_accepted(ctx):
    with pytest.raises(ValueError, match="max_task_retries must be an integer >= 0, or -1"):
        rd.range(2).map_batches(lambda b: b, max_task_retries=-2)

    class Same:
        def __call__(self, batch):
            return batch

    ds = rd.range(4).map_batches(Same, concurrency=1, max_restarts=0)
    assert sorted(r["id"] for r in ds.take_all()) == [0, 1, 2, 3]


# -- concurrency=(min, max) with a function -------------------------------------------------------
def test_a_concurrency_tuple_with_a_function_has_rays_message(ctx):
    with pytest.raises(ValueError, match="``concurrency`` is set as a tuple of integers") as refused:
        rd.range(4).map(lambda r: r, concurrency=(2, 4))
    assert "use concurrency=n" in str(refused.value)

    class Same:
        def __call__(self, row):
            return row

    for bad in ("dummy", (1, 3, 5)):
        with pytest.raises(ValueError, match="``concurrency`` is expected to be set a"):
            rd.range(4).map(Same, concurrency=bad)


def test_repr_of_a_read_shows_the_rows_a_count_found(ctx, tmp_path):
    """As Ray's repr after an execution: ``count()`` of a CSV read ran its plan, so the rows are known."""
    for i in range(2):
        (tmp_path / f"{i}.csv").write_text("one,two\n" + "".join(f"{i},{c}\n" for c in "abc"))
    ds = rd.read_csv(str(tmp_path))
    assert repr(ds) == "Dataset(num_rows=?, schema=Unknown schema)"
    assert ds.count() == 6
    assert repr(ds) == "Dataset(num_rows=6, schema=Unknown schema)"  # counted from block metadata: nothing read
    assert ds.schema() is not None
    assert repr(ds) == "Dataset(num_rows=6, schema={one: int64, two: string})"
    assert "num_rows=?" in repr(ds.map(lambda row: row))  # a new plan knows nothing yet
