"""What Ray Data knows without running a dataset (issue 32): ``count()`` from metadata (a bare
``read_parquet``'s footers, on local files and the moto S3 server; ``range``; ``from_items``; a
materialized dataset), ``repr(ds)`` of a ``read_parquet`` with its footers' rows and the schema its
read tasks give (Ray's ``Dataset(num_rows=6, schema={one: int64, two: string})``), ``read_datasource``'s
resource arguments applied to its read tasks, and ``input_files()`` leaving a reseeded file
shuffle's next order alone. On real local Spark; "no run" is checked twice: the dataset has no
last run, and Spark started no job."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.block import BlockMetadata
from airflow_streambatch.engine.compute import TaskPoolStrategy
from airflow_streambatch.engine.datasource import Datasource, PathPartitionFilter, ReadTask
from airflow_streambatch.engine.plan.planner import plan


def _last_job(spark) -> int:
    """The newest Spark job's id (-1 before any): the engine sets no job group."""
    return max(spark.sparkContext.statusTracker().getJobIdsForGroup(), default=-1)


def _write_parts(root: str, filesystem=None) -> int:
    """Three Parquet files (one of two row groups) under a Hive partition; their rows in all."""
    sizes = {"k=a/one.parquet": 5, "k=a/two.parquet": 700, "k=b/three.parquet": 9}
    for name, rows in sizes.items():
        if filesystem is None:
            os.makedirs(os.path.dirname(f"{root}/{name}"), exist_ok=True)
        pq.write_table(pa.table({"x": pa.array(range(rows), pa.int64())}), f"{root}/{name}", row_group_size=400,
                       filesystem=filesystem)
    return sum(sizes.values())


# -- count() without a run ------------------------------------------------------------------
def test_count_of_a_bare_parquet_read_sums_its_footers_without_a_run(ctx, spark, tmp_path):
    rows = _write_parts(str(tmp_path / "in"))
    before = _last_job(spark)
    ds = rd.read_parquet(tmp_path / "in")
    assert ds.count() == rows and ds.last_run_stats is None
    narrowed = rd.read_parquet(tmp_path / "in", columns=["x"], partition_filter=PathPartitionFilter.of(
        lambda parts: parts.get("k") == "a"))
    assert narrowed.count() == 705 and narrowed.last_run_stats is None  # columns keep rows; the filter drops a file
    assert ds.limit(10).count() == 10 and ds.limit(10_000).count() == rows
    assert _last_job(spark) == before  # Spark ran nothing

    filtered = rd.read_parquet(tmp_path / "in", filter=pc.field("x") < 6)  # footers count rows it drops: a run
    assert filtered.count() == 5 + 6 + 6 and filtered.last_run_stats is not None
    assert _last_job(spark) > before  # the check above can see a job
    kept = ds.filter(lambda row: row["x"] % 2 == 0)  # a transform after the read: a run
    assert kept.count() == 3 + 350 + 5 and kept.last_run_stats is not None


def test_count_from_footers_reads_them_through_the_reads_filesystem_on_s3(ctx, spark, s3_bucket):
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    rows = _write_parts(f"{bucket}/in", filesystem=fs)
    before = _last_job(spark)
    by_scheme = rd.read_parquet(f"{s3_bucket}/in")
    given = rd.read_parquet(f"{bucket}/in", filesystem=fs)  # no scheme: only the given filesystem finds it
    assert by_scheme.count() == given.count() == rows
    assert by_scheme.last_run_stats is None and given.last_run_stats is None and _last_job(spark) == before


def test_count_of_range_items_and_a_materialized_dataset_is_known(ctx, spark):
    materialized = rd.range(50, override_num_blocks=5).materialize()
    before = _last_job(spark)
    assert rd.range(1234).count() == 1234 and rd.range(0).count() == 0
    assert rd.from_items([{"a": 1}, {"a": 2}, 3]).count() == 3 and rd.from_items([]).count() == 0
    assert materialized.count() == 50 and materialized.limit(7).count() == 7
    assert _last_job(spark) == before


# -- repr(ds) of a file read ----------------------------------------------------------------------
def test_repr_of_a_parquet_read_shows_footer_rows_and_schema_without_a_run(ctx, spark, tmp_path):
    rows = _write_parts(str(tmp_path / "in"))
    before = _last_job(spark)
    ds = rd.read_parquet(tmp_path / "in")
    assert repr(ds) == str(ds) == f"Dataset(num_rows={rows}, schema={{x: int64, k: string}})"  # Ray's form
    narrowed = rd.read_parquet(tmp_path / "in", columns=["k"], include_paths=True)
    assert repr(narrowed) == f"Dataset(num_rows={rows}, schema={{k: string, path: string}})"
    filtered = rd.read_parquet(tmp_path / "in", filter=pc.field("x") < 6)  # rows unknown, schema known
    assert repr(filtered) == "Dataset(num_rows=?, schema={x: int64, k: string})"
    mapped = rd.read_parquet(tmp_path / "in" / "k=b", partitioning=None).map_batches(lambda batch: batch)
    assert repr(mapped) == "MapBatches(<lambda>)\n+- Dataset(num_rows=9, schema={x: int64})"
    assert _last_job(spark) == before and ds.last_run_stats is None  # footers only: Spark ran nothing
    for read in (ds, narrowed, filtered):  # the schema shown is the one the read tasks give
        assert read.to_arrow().schema.equals(read._logical[0].datasource.meta_schema()), repr(read)

    csv = tmp_path / "in.csv"
    csv.write_text("a,b\n1,x\n")
    for other in (rd.read_csv(csv), rd.read_json(tmp_path / "in" / "k=b"), rd.read_text(csv)):
        assert repr(other) == "Dataset(num_rows=?, schema=Unknown schema)"  # as Ray shows a read it cannot know
    gone = rd.read_parquet(tmp_path / "in" / "k=b")
    os.remove(tmp_path / "in" / "k=b" / "three.parquet")
    assert repr(gone) == "Dataset(num_rows=?, schema=Unknown schema)"  # a listing that fails: the run reports it


def test_repr_of_a_parquet_read_on_s3_reads_its_footers_through_the_reads_filesystem(ctx, spark, s3_bucket):
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    rows = _write_parts(f"{bucket}/in", filesystem=fs)
    before = _last_job(spark)
    want = f"Dataset(num_rows={rows}, schema={{x: int64, k: string}})"
    assert repr(rd.read_parquet(f"{s3_bucket}/in")) == repr(rd.read_parquet(f"{bucket}/in", filesystem=fs)) == want
    assert _last_job(spark) == before


# -- read_datasource(num_cpus=, concurrency=, ray_remote_args=) ------------------------------
class SpanSource(Datasource):
    """``parallelism`` read tasks of one row each; each records when it ran (``spans``) and sleeps."""

    def __init__(self, spans: str | None = None, sleep_s: float = 0.0):
        self.spans, self.sleep_s, self.asked = spans, sleep_s, []

    def get_read_tasks(self, parallelism: int) -> list[ReadTask]:
        self.asked.append(parallelism)
        return [ReadTask(lambda i=i: [_span(i, self.spans, self.sleep_s)], BlockMetadata(
            num_rows=1, size_bytes=8, input_files=None, exec_stats=None)) for i in range(parallelism)]


def _span(i: int, spans: str | None, sleep_s: float) -> pa.Table:
    start = time.time()
    time.sleep(sleep_s)
    if spans is not None:
        with open(os.path.join(spans, f"task-{i}-{os.getpid()}-{time.time_ns()}"), "w") as f:
            f.write(f"{start} {time.time()}")
    return pa.table({"id": [i]})


def _most_at_once(spans: str) -> int:
    found = [tuple(map(float, open(os.path.join(spans, name)).read().split())) for name in os.listdir(spans)]
    return max(sum(a <= start < b for a, b in found) for start, _ in found)


def _request(ds) -> tuple[dict, int | None]:
    read = plan(ds._logical)[0]
    return read.compute.as_dict(), read.compute.concurrency


def test_read_datasource_runs_its_read_tasks_with_rays_resource_arguments(ctx, tmp_path):
    capped, halves = tmp_path / "capped", tmp_path / "halves"
    capped.mkdir()
    halves.mkdir()
    ds = rd.read_datasource(SpanSource(str(capped), 0.3), concurrency=1, override_num_blocks=4)
    assert sorted(row["id"] for row in ds.take_all()) == [0, 1, 2, 3] and _most_at_once(str(capped)) == 1
    ds = rd.read_datasource(SpanSource(str(halves), 0.3), num_cpus=2, override_num_blocks=4)  # 4 CPU slots
    assert len(ds.take_all()) == 4 and _most_at_once(str(halves)) <= 2
    sized = SpanSource()
    assert len(rd.read_datasource(sized, concurrency=1).take_all()) == 8 == sized.asked[-1]  # cap, not fewer tasks

    assert _request(rd.read_datasource(SpanSource(), num_cpus=2)) == ({"CPU": 2.0}, None)
    assert _request(rd.read_datasource(SpanSource(), num_cpus=2, ray_remote_args={
        "num_cpus": 3, "resources": {"disk": 1}, "scheduling_strategy": "SPREAD"})) == ({"CPU": 2.0, "disk": 1.0}, None)
    assert _request(rd.read_datasource(SpanSource(), compute=TaskPoolStrategy(size=2))) == ({"CPU": 1.0}, 2)
    assert _request(rd.read_datasource(SpanSource(), concurrency=3, compute=TaskPoolStrategy(size=2)))[1] == 3
    assert _request(rd.read_datasource(SpanSource(), memory=1 << 20)) == ({"CPU": 1.0}, None)  # checked only


@pytest.mark.parametrize("args,error,message", [
    ({"concurrency": 0}, ValueError, r"read_datasource: concurrency must be a positive integer"),
    ({"num_cpus": -1}, ValueError, r"read_datasource: num_cpus must be a number >= 0"),
    ({"memory": "1GB"}, ValueError, r"read_datasource: memory must be a number of bytes"),
    ({"ray_remote_args": {"num_cpu": 1}}, ValueError, r"Invalid option keyword num_cpu for remote functions"),
    ({"ray_remote_args": [("num_cpus", 1)]}, TypeError, r"ray_remote_args must be a dict"),
    ({"compute": "actors"}, ValueError, r"compute must be a TaskPoolStrategy or an ActorPoolStrategy"),
])
def test_read_datasource_refuses_bad_resource_arguments_naming_them(args, error, message):
    with pytest.raises(error, match=message):
        rd.read_datasource(SpanSource(), **args)


# -- input_files() and a reseeded shuffle -------------------------------------------------------
def test_input_files_leaves_a_reseeded_shuffles_next_order_alone(ctx, tmp_path):
    ctx.execution_options.preserve_order = True  # rows come out in the order of the read's files
    paths = []
    for i in range(6):
        paths.append(str(tmp_path / f"f{i}.parquet"))
        pq.write_table(pa.table({"id": [i]}), paths[-1])
    shuffle = rd.FileShuffleConfig(seed=11)
    plain, probed = rd.read_parquet(tmp_path, shuffle=shuffle), rd.read_parquet(tmp_path, shuffle=shuffle)
    listed = probed.input_files()
    assert listed == probed.input_files() and sorted(listed) == paths
    first = [row["id"] for row in probed.take_all()]
    assert first == [row["id"] for row in plain.take_all()] != sorted(first)  # as if never asked
    assert [paths[i] for i in first] == listed  # input_files() lists them in the next run's order
    assert [row["id"] for row in probed.take_all()] == [row["id"] for row in plain.take_all()] != first
