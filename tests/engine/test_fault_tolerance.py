"""Retries, partition failure isolation, exactly-once commits and lineage recovery (local Spark).

Faults are real: user code raises, a Python worker process kills itself mid-task,
block files are deleted from disk. The cluster-level faults (a killed executor)
are in test_cluster_faults.py.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as sb
from session_kinds import spark_kind  # noqa: F401 - every test on classic and Spark Connect sessions
from cluster_job import FailOn, first_time


def _ids(path) -> list[int]:
    return sorted(pq.read_table(str(path))["id"].to_pylist())


def test_failed_partitions_are_isolated_named_and_retried_alone_on_rerun(ctx, tmp_path):
    ctx.max_failed_partitions = 2
    out = tmp_path / "out"
    ds = sb.range(100, override_num_blocks=10)  # partition p holds ids 10p .. 10p+9
    with pytest.warns(sb.PartialResultWarning, match="2 input partition"):
        result = ds.map_batches(FailOn, fn_constructor_args=({25, 71},),
                                batch_format="pyarrow").write_parquet(str(out), mode="resume")
    assert sorted(f.partition for f in result.failed) == [2, 7]
    assert all("poisoned row" in f.error and f.operator.startswith("ReadRange") for f in result.failed)
    assert sorted(result.committed) == [0, 1, 3, 4, 5, 6, 8, 9]
    assert _ids(out) == [i for i in range(100) if i // 10 not in (2, 7)]  # exactly the healthy partitions

    fixed = ds.map_batches(FailOn, fn_constructor_args=(set(),), batch_format="pyarrow")
    rerun = fixed.write_parquet(str(out), mode="resume")
    assert sorted(rerun.committed) == [2, 7] and sorted(rerun.skipped) == [0, 1, 3, 4, 5, 6, 8, 9]
    assert fixed.last_run_stats.ops[0].tasks_done == 2  # Spark ran only the two failed partitions
    assert _ids(out) == list(range(100))  # every row exactly once


def test_too_many_failed_partitions_fail_the_run_listing_each(ctx, tmp_path):
    ctx.max_failed_partitions = 1
    with pytest.raises(sb.PartitionsFailedError) as info:
        sb.range(100, override_num_blocks=10).map_batches(FailOn, fn_constructor_args=({5, 55, 95},),
                                                          batch_format="pyarrow").write_parquet(
            str(tmp_path / "out"))
    assert len(info.value.failures) == 2  # the run stops at the first failure past the allowance
    assert "max_failed_partitions=1" in str(info.value)


def test_user_error_is_retried_and_then_succeeds(ctx, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    ds = sb.range(100, override_num_blocks=10).map_batches(FailOn, fn_constructor_args=({33, 66}, str(markers)),
                                                           batch_format="pyarrow")
    result = ds.write_parquet(str(tmp_path / "out"))
    assert not result.failed and len(result.committed) == 10
    assert _ids(tmp_path / "out") == list(range(100))
    stats = ds.last_run_stats.ops[0]
    assert (stats.tasks_done, stats.tasks_retried) == (10, 2)  # done counts each task once; retries apart


def _kill_worker_once(batch, marker_dir):
    if 42 in batch["id"].to_pylist() and first_time(marker_dir, "killed"):
        os._exit(1)  # the Python worker process dies mid-task
    return batch


def test_python_worker_killed_mid_task_is_rerun_exactly_once(ctx, tmp_path):
    from functools import partial

    markers = tmp_path / "markers"
    markers.mkdir()
    ds = sb.range(100, override_num_blocks=10).map_batches(partial(_kill_worker_once, marker_dir=str(markers)),
                                                           batch_format="pyarrow")
    result = ds.write_parquet(str(tmp_path / "out"))
    assert os.path.exists(markers / "killed")
    assert not result.failed and _ids(tmp_path / "out") == list(range(100))


def test_commit_records_are_the_authority_and_staging_is_cleaned(ctx, tmp_path):
    out = tmp_path / "out"
    result = sb.range(30, override_num_blocks=3).write_parquet(str(out), mode="resume")
    assert sorted(os.listdir(out)) == ["_write.json", "p00000", "p00001", "p00002"]  # no empty _staging
    record = json.loads((out / "p00001" / "_commit.json").read_text())
    assert record["label"] == "range[10:20]" and record["rows"] == 10 and record["schema"] == [["id", "int64"]]
    assert len(result.files) == 3 and all(os.path.exists(f) for f in result.files)


def test_changed_partitioning_is_refused_instead_of_duplicating(ctx, tmp_path):
    out = tmp_path / "out"
    sb.range(30, override_num_blocks=3).write_parquet(str(out), mode="resume")
    with pytest.raises(ValueError, match="input partitioning changed"):
        sb.range(30, override_num_blocks=5).write_parquet(str(out), mode="resume")


def _widen(batch):
    return batch.append_column("payload", pa.array([b"x" * 1000] * batch.num_rows))


def test_lost_blocks_are_rebuilt_recursively_by_lineage(ctx, tmp_path):
    ctx.target_max_block_size = 20_000  # several blocks per task
    mat = (
        sb.range(1000, override_num_blocks=4)
        .map_batches(_widen, batch_format="pyarrow")
        .map_batches(lambda b: b.drop_columns(["payload"]).append_column("y", b["id"]), num_cpus=0.5,
                     batch_format="pyarrow")
        .materialize()
    )
    for ref in mat._refs[:3]:  # the blocks' producers' inputs are long gone too
        os.remove(ref.path)
    rows = mat.map_batches(lambda b: b, batch_format="pyarrow").take_all()
    assert sorted(r["id"] for r in rows) == list(range(1000))


def _random_rows(row):
    import random

    return [{"id": row["id"], "i": i, "pad": "x" * 1000} for i in range(random.randint(1, 60))]


def test_non_deterministic_replay_is_an_error_naming_the_task(ctx):
    ctx.target_max_block_size = 4000
    mat = sb.range(1, override_num_blocks=1).flat_map(_random_rows).materialize()
    os.remove(mat._refs[0].path)
    with pytest.raises(sb.LineageError, match="not deterministic") as info:
        for _ in range(20):  # a replay matches the first run's block count only by chance
            mat.map_batches(lambda b: b, batch_format="pyarrow").count()
            os.remove(mat._refs[0].path)
    assert "ReadRange->FlatMap(_random_rows)" in str(info.value)
