"""Ray Data's transform arguments and ``ray.data.datasource`` names (issue 32, transforms part).

Each test pins a behaviour Ray Data's documentation and source give (``repartition``,
``ActorPoolStrategy``/``compute=``, ``map_batches(zero_copy_batch=, max_concurrency=)``,
``random_sample``'s checks, ``map`` rows with other columns, custom ``Datasource``/``ReadTask``
read with ``read_datasource``, ``BlockMetadata``, metadata providers), run on real local Spark.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.block import BlockMetadata
from airflow_streambatch.engine.datasource import (
    Datasource,
    DefaultFileMetadataProvider,
    FastFileMetadataProvider,
    ParquetMetadataProvider,
    ReadTask,
)


def _block_rows(ds) -> list[int]:
    return [ref.num_rows for ref in ds.iter_internal_ref_bundles()]


def _ids(ds) -> list[int]:
    return sorted(row["id"] for row in ds.take_all())


# -- repartition ---------------------------------------------------------------------------
@pytest.mark.parametrize("num_blocks,target,shuffle,message", [
    (4, 10, False, "Only one of `num_blocks` or `target_num_rows_per_block` must be set, but not both."),
    (None, None, False, "Either `num_blocks` or `target_num_rows_per_block` must be set"),
    (None, 10, True, "`shuffle` must be False when `target_num_rows_per_block` is set."),
])
def test_repartition_refuses_what_ray_refuses_with_its_text(num_blocks, target, shuffle, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rd.range(10).repartition(num_blocks=num_blocks, target_num_rows_per_block=target, shuffle=shuffle)


def test_repartition_by_key_or_sorted_is_refused_naming_the_arguments():
    with pytest.raises(ValueError, match=r"repartition\(keys=\['id'\], sort=False\)"):
        rd.range(10).repartition(3, keys=["id"])
    with pytest.warns(UserWarning, match="`keys` is ignored when `target_num_rows_per_block` is set."):
        rd.range(10).repartition(target_num_rows_per_block=5, keys=["id"])


@pytest.mark.parametrize("target,expected", [(8, [8] * 16), (50, [50, 50, 28]), (128, [128])])
def test_target_num_rows_per_block_cuts_blocks_of_exactly_that_many_rows(ctx, target, expected):
    ds = rd.range(128, override_num_blocks=16).repartition(target_num_rows_per_block=target, strict=True)
    materialized = ds.materialize()
    assert sorted(_block_rows(materialized), reverse=True) == expected
    assert _ids(materialized) == list(range(128))


def test_shuffled_repartition_gives_each_output_block_a_slice_of_every_input_block(ctx):
    # 10 input blocks of 2 rows, cut into slices of ceil(2 / 5) = 1 row: output block 0 takes the
    # first row of every input block, block 1 the second, as Ray's shuffling repartition cuts them.
    blocks = [ref for ref in rd.range(20, override_num_blocks=10).repartition(5, shuffle=True).materialize()
              .iter_internal_ref_bundles()]
    assert sorted(ref.num_rows for ref in blocks) == [10, 10]
    ds = rd.range(20, override_num_blocks=10).repartition(5, shuffle=True)
    by_parity = sorted(tuple(sorted(table.column("id").to_pylist())) for table in ds._iter_tables())
    assert by_parity == [tuple(range(0, 20, 2)), tuple(range(1, 20, 2))]
    large = rd.range(10000, override_num_blocks=10).repartition(20, shuffle=True).materialize()
    assert _block_rows(large) == [500] * 20 and large.sum("id") == 49995000


def test_a_write_after_target_rows_commits_one_partition_per_block(ctx, tmp_path):
    out = tmp_path / "out"
    result = rd.range(10, override_num_blocks=3).repartition(target_num_rows_per_block=4).write_parquet(str(out))
    assert sorted((j, rec.rows) for j, rec in result.committed.items()) == [(0, 4), (1, 4), (2, 2)]
    assert _ids(rd.read_parquet(str(out))) == list(range(10))


# -- compute= (ActorPoolStrategy / TaskPoolStrategy) ---------------------------------------------
class AddOne:
    def __call__(self, batch):
        return {"id": batch["id"] + 1}


def _add_one(batch):
    return {"id": batch["id"] + 1}


@pytest.mark.parametrize("kwargs,message", [
    ({"size": 0}, "size must be >= 1"),
    ({"size": 2, "min_size": 1}, "min_size, max_size, and initial_size cannot be set at the same time as `size`"),
    ({"min_size": 0}, "min_size must be >= 1"),
    ({"min_size": 3, "max_size": 2}, "min_size must be <= max_size"),
    ({"min_size": 2, "max_size": 4, "initial_size": 1}, r"initial_size \(1\) must be >= min_size \(2\)"),
    ({"min_size": 2, "max_size": 4, "initial_size": 5}, r"initial_size \(5\) must be <= max_size \(4\)"),
    ({"max_tasks_in_flight_per_actor": 0}, "max_tasks_in_flight_per_actor must be >= 1"),
])
def test_actor_pool_strategy_checks_its_arguments_as_ray_does(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rd.ActorPoolStrategy(**kwargs)


def test_compute_must_fit_the_kind_of_fn_as_in_ray():
    with pytest.raises(ValueError, match="``compute`` must specify an actor compute strategy when using a callable"):
        rd.range(4).map_batches(AddOne, compute=rd.TaskPoolStrategy())
    with pytest.raises(ValueError, match="but ``fn`` is not a callable class"):
        rd.range(4).map_batches(_add_one, compute=rd.ActorPoolStrategy(size=2))
    with pytest.raises(ValueError, match="but ``fn`` is not a callable class"):
        rd.range(4).map(lambda row: row, compute="actors")


@pytest.mark.parametrize("fn,compute,cap", [
    (AddOne, rd.ActorPoolStrategy(size=2), 2),
    (AddOne, rd.ActorPoolStrategy(min_size=1, max_size=3), 3),
    (AddOne, rd.ActorPoolStrategy(min_size=2), None),
    (_add_one, rd.TaskPoolStrategy(size=2), 2),
    (_add_one, "tasks", None),
])
def test_compute_becomes_the_engines_concurrency_cap(fn, compute, cap):
    assert rd.range(4).map_batches(fn, compute=compute)._logical[-1].compute.concurrency == cap


def test_an_actor_pool_runs_the_class(ctx):
    ds = rd.range(12, override_num_blocks=4).map_batches(AddOne, compute=rd.ActorPoolStrategy(size=1), batch_size=4)
    assert _ids(ds) == list(range(1, 13))
    rows = rd.range(6).map(lambda row: {"id": row["id"] * 2}, compute=rd.TaskPoolStrategy(size=1))
    assert _ids(rows) == [0, 2, 4, 6, 8, 10]


# -- zero_copy_batch, max_concurrency ------------------------------------------------------------
def _add_in_place(batch):
    batch["id"] += 100  # Ray's default (zero_copy_batch=False) hands a writable batch
    return batch


def _writable(batch):
    return {"id": batch["id"], "writable": np.full(len(batch["id"]), batch["id"].flags.writeable)}


def test_batches_are_writable_by_default_and_may_be_read_only_with_zero_copy(ctx):
    ds = rd.range(8, override_num_blocks=2)
    assert _ids(ds.map_batches(_add_in_place)) == list(range(100, 108))
    assert all(row["writable"] for row in ds.map_batches(_writable).take_all())
    zero_copy = ds.map_batches(_writable, zero_copy_batch=True, batch_size=None).take_all()
    assert not any(row["writable"] for row in zero_copy)  # Arrow's own (read-only) memory, no copy
    with pytest.raises(TypeError, match="zero_copy_batch must be True or False"):
        ds.map_batches(_add_in_place, zero_copy_batch="yes")


class SlowPeak:
    """Records how many of its calls run at once (one instance shared by a task's threads)."""

    def __init__(self):
        self.lock, self.running, self.peak = threading.Lock(), 0, 0

    def __call__(self, batch):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(0.1)
        with self.lock:
            self.running -= 1
            peak = self.peak
        return {"id": batch["id"], "peak": np.full(len(batch["id"]), peak)}


def test_max_concurrency_runs_a_class_on_that_many_batches_at_once_in_order(ctx):
    ds = rd.range(8, override_num_blocks=1)
    rows = list(ds.map_batches(SlowPeak, batch_size=1, max_concurrency=4).iter_rows())
    assert [row["id"] for row in rows] == list(range(8))  # one task: its batches' outputs in input order
    assert max(row["peak"] for row in rows) == 4
    assert max(row["peak"] for row in ds.map_batches(SlowPeak, batch_size=1).take_all()) == 1
    with pytest.raises(ValueError, match="max_concurrency=2 sets threads per actor"):
        ds.map_batches(_add_one, max_concurrency=2)


# -- random_sample, map rows ---------------------------------------------------------------------
@pytest.mark.parametrize("make,fraction,message", [
    (lambda: rd.range(1), -1, "Fraction must be between 0 and 1."),
    (lambda: rd.range(1), 10, "Fraction must be between 0 and 1."),
    (lambda: rd.range(0), 0.2, "Cannot sample from an empty Dataset."),
    (lambda: rd.from_items([]), 0.2, "Cannot sample from an empty Dataset."),
])
def test_random_sample_refuses_what_ray_refuses(make, fraction, message):
    with pytest.raises(ValueError, match=message):
        make().random_sample(fraction)


def test_random_sample_with_a_seed_keeps_the_same_rows(ctx):
    ds = rd.range(200, override_num_blocks=4)
    first = _ids(ds.random_sample(0.5, seed=7))
    assert first == _ids(ds.random_sample(0.5, seed=7)) and 40 < len(first) < 160


def _a_or_b(row):
    return {"a": "hello1"} if row["id"] > 5 else {"b": "hello1"}


def _both_in_either_order(row):
    return {"a": "hello1", "b": "hello2"} if row["id"] > 5 else {"b": "hello2", "a": "hello1"}


def test_map_rows_with_other_columns_raise_rays_error_text(ctx):
    ds = rd.range(10, override_num_blocks=1)
    with pytest.raises(ValueError, match="Current row has different columns compared to previous rows."):
        ds.map(_a_or_b).materialize()
    assert ds.map(_both_in_either_order).take() == [{"a": "hello1", "b": "hello2"}] * 10


# -- custom datasources ----------------------------------------------------------------------------
class NumbersDatasource(Datasource):
    """``n`` ids, cut into as many read tasks as asked; every other task yields a DataFrame."""

    def __init__(self, n: int):
        self.n, self.asked = n, []

    def estimate_inmemory_data_size(self):
        return 8 * self.n

    def get_read_tasks(self, parallelism: int) -> list[ReadTask]:
        self.asked.append(parallelism)
        bounds = [round(i * self.n / parallelism) for i in range(parallelism + 1)]
        tasks = []
        for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if i % 2:
                def read(lo=lo, hi=hi):
                    yield pd.DataFrame({"id": list(range(lo, hi))})
            else:
                def read(lo=lo, hi=hi):
                    return [pa.table({"id": pa.array(range(lo, hi), pa.int64())})]
            tasks.append(ReadTask(read, BlockMetadata(num_rows=hi - lo, size_bytes=8 * (hi - lo), input_files=None,
                                                      exec_stats=None)))
        return tasks


def test_a_custom_datasource_reads_one_partition_per_read_task(ctx):
    source = NumbersDatasource(30)
    ds = rd.read_datasource(source, override_num_blocks=3)
    assert repr(ds) == "Dataset(num_rows=?, schema=Unknown schema)"  # Ray's form; nothing read to print it
    assert _ids(ds) == list(range(30)) and source.asked[-1] == 3
    assert sorted(_block_rows(ds)) == [10, 10, 10]
    assert rd.read_datasource(source).count() == 30 and source.asked[-1] >= 2  # engine-sized: two per slot


class LegacySource(Datasource):
    def prepare_read(self, parallelism, *, rows):
        return [ReadTask(lambda: [pa.table({"id": list(range(rows))})],
                         BlockMetadata(num_rows=rows, size_bytes=None, schema=None, input_files=None, exec_stats=None),
                         per_task_row_limit=3)]


class EmptySource(Datasource):
    def get_read_tasks(self, parallelism):
        return []


def test_legacy_sources_empty_sources_and_bad_read_tasks(ctx):
    assert _ids(rd.read_datasource(LegacySource(), rows=5)) == [0, 1, 2]  # read_args to prepare_read; row limit
    assert rd.read_datasource(EmptySource()).take_all() == []
    with pytest.raises(TypeError, match=r"unexpected arguments \['rows'\]"):
        rd.read_datasource(EmptySource(), rows=5)
    with pytest.raises(TypeError, match="must implement get_read_tasks"):
        rd.read_datasource(Datasource())
    with pytest.raises(TypeError, match="metadata must be an airflow_streambatch.engine.block.BlockMetadata"):
        ReadTask(lambda: [], {"num_rows": 1})
    with pytest.raises(ValueError, match="num_rows must be an integer >= 0 or None"):
        BlockMetadata(num_rows=-1, size_bytes=0)


def test_metadata_providers_list_files_give_hints_and_are_accepted_by_reads(ctx, tmp_path):
    folder = tmp_path / "csv"
    folder.mkdir()
    for name, text in (("a.csv", "id\n1\n"), ("b.csv", "id\n2\n3\n")):
        (folder / name).write_text(text)
    listed = list(DefaultFileMetadataProvider().expand_paths([str(folder)]))
    assert listed == [(str(folder / "a.csv"), 5), (str(folder / "b.csv"), 7)]
    hint = FastFileMetadataProvider()([path for path, _ in listed], rows_per_file=2, file_sizes=[5, 7])
    assert (hint.num_rows, hint.size_bytes, hint.input_files) == (4, 12, [path for path, _ in listed])
    assert ParquetMetadataProvider()(["x.parquet"]).size_bytes is None
    read = rd.read_csv(str(folder), meta_provider=FastFileMetadataProvider())  # a hint: the same rows
    assert _ids(read) == [1, 2, 3]
    with pytest.raises(TypeError, match="read_json: meta_provider must be a metadata provider"):
        rd.read_json(str(folder), meta_provider="fast")
