"""Bad arguments and bad data give errors that name the operator, partition, file or setting."""

from __future__ import annotations

import pytest

import airflow_streambatch.engine as sb
from session_kinds import spark_kind  # noqa: F401 - every test on classic and Spark Connect sessions


def test_unknown_batch_format_names_operator_and_choices():
    with pytest.raises(ValueError, match=r"MapBatches\(f\): unknown batch_format 'arrow'.*pyarrow"):
        def f(b):
            return b

        sb.range(3).map_batches(f, batch_format="arrow")


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: sb.range(3).map_batches(lambda b: b, batch_size=-1,
                                         batch_format="pyarrow"), "batch_size must be a positive integer"),
        (lambda: sb.range(3).map_batches(lambda b: b, num_gpus=-1,
                                         batch_format="pyarrow"), "num_gpus must be a number >= 0"),
        (lambda: sb.range(3).map_batches(lambda b: b, concurrency=0,
                                         batch_format="pyarrow"), "concurrency must be a positive integer"),
        (lambda: sb.range(3).limit(-2), r"limit\(n\): n must be an integer >= 0"),
        (lambda: sb.range(3).repartition(0), "num_blocks must be a positive integer"),
        (lambda: sb.range(-1), "n must be an integer >= 0"),
        (lambda: sb.range(3, override_num_blocks=-4), "override_num_blocks must be a positive integer"),
        (lambda: sb.range(3).map_batches(lambda b: b, fn_constructor_args=(1,),
                                         batch_format="pyarrow"), "apply only when fn is a class"),
    ],
)
def test_bad_arguments_are_rejected_at_build_time(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.parametrize(
    "field, value",
    [("target_max_block_size", -1), ("memory_limit", 0), ("scheduling_policy", "greedy"), ("resources", {"GPU": -1})],
)
def test_data_context_rejects_bad_settings_naming_them(field, value):
    ctx = sb.DataContext()
    with pytest.raises(ValueError, match=f"DataContext.{field}"):
        setattr(ctx, field, value)


def test_udf_returning_wrong_type_names_the_operator(ctx):
    def to_list(batch):
        return [1, 2, 3]

    with pytest.raises(sb.PartitionsFailedError, match=r"MapBatches\(to_list\).*returned list; a batch function must"):
        sb.range(10).map_batches(to_list, batch_format="pyarrow").count()


def test_udf_exception_names_operator_partition_and_carries_traceback(ctx):
    def explode_on_7(row):
        if row["id"] == 7:
            raise RuntimeError("bad row 7")
        return row

    with pytest.raises(sb.PartitionsFailedError) as info:
        sb.range(10, override_num_blocks=5).map(explode_on_7).count()
    err = info.value
    assert [f.partition for f in err.failures] == [3]  # ids 6-7 are the fourth range partition
    assert "Map(explode_on_7)" in str(err) and "bad row 7" in str(err) and "range[6:8]" in str(err)
    assert "max_failed_partitions" in str(err)
    assert "explode_on_7" in err.failures[0].traceback


def test_corrupt_parquet_file_error_names_the_file(ctx, tmp_path):
    good = sb.range(10).write_parquet(str(tmp_path / "in"))
    bad = tmp_path / "in" / "corrupt.parquet"
    bad.write_bytes(b"PAR1 this is not parquet at all")
    with pytest.raises(sb.PartitionsFailedError, match="corrupt.parquet") as info:
        sb.read_parquet(str(tmp_path / "in"), override_num_blocks=len(good.files) + 1).count()
    assert "ReadParquet" in str(info.value)


def test_schema_drift_between_files_names_both_files(ctx, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1, 2], "name": ["a", "b"]}), tmp_path / "in" / "a.parquet")
    pq.write_table(pa.table({"id": ["3"], "name": ["c"]}), tmp_path / "in" / "b.parquet")
    with pytest.raises(sb.PartitionsFailedError, match=r"b.parquet.*schema drift: 'id' is string not int64.*a.parquet"):
        sb.read_parquet(str(tmp_path / "in"), override_num_blocks=2).count()


def test_udf_changing_schema_between_batches_is_named(ctx):
    def flaky_schema(batch):
        if batch["id"][0].as_py() == 0:
            return batch
        return batch.append_column("extra", batch["id"])

    with pytest.raises(sb.PartitionsFailedError, match=r"MapBatches\(flaky_schema\) produced batches of different"):
        sb.range(10, override_num_blocks=1).map_batches(flaky_schema, batch_size=5, batch_format="pyarrow").count()


def test_missing_input_path_is_a_clear_error(ctx, tmp_path):
    with pytest.raises(FileNotFoundError, match="input path does not exist"):
        sb.read_parquet(str(tmp_path / "nope")).count()


def test_gpu_operator_without_gpu_slots_names_the_setting(ctx):
    with pytest.raises(ValueError, match=r"GPU=1 per task but only 0 GPU slot.*DataContext.get_current\(\).resources"):
        sb.range(3).map_batches(lambda b: b, num_gpus=1, batch_format="pyarrow").count()
