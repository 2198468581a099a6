"""A finished write leaves no ``_staging`` beside its committed partitions (issue 32, item 6):
locally and on the S3 server (where an empty 'directory' is a marker object), while staging
that is not this run's is never touched."""

from __future__ import annotations

import os

import boto3
import pyarrow.parquet as pq

import airflow_streambatch.engine as rd


def test_a_local_write_removes_its_staging_and_the_empty_staging_dir(ctx, tmp_path):
    out = tmp_path / "out"
    rd.range(30, override_num_blocks=3).write_parquet(str(out))
    assert sorted(os.listdir(out)) == ["_write.json", "p00000", "p00001", "p00002"]
    rd.range(10, override_num_blocks=2).write_parquet(str(out), mode="overwrite")  # a second write too
    assert sorted(os.listdir(out)) == ["_write.json", "p00000", "p00001"]
    assert sorted(pq.read_table(str(out)).column("id").to_pylist()) == list(range(10))


def test_staging_that_is_not_this_runs_stays(ctx, tmp_path):
    """A run's staging this driver cannot tell dead (no owner mark: being created, or another
    host's) keeps ``_staging`` in place; only this run's own directory goes."""
    out = tmp_path / "out"
    other = out / "_staging" / "someone-elses-run"
    other.mkdir(parents=True)
    (other / "part.parquet").write_bytes(b"staged")
    rd.range(20, override_num_blocks=2).write_parquet(str(out))
    assert os.listdir(out / "_staging") == ["someone-elses-run"]
    assert (other / "part.parquet").read_bytes() == b"staged"


def test_a_write_to_s3_leaves_no_staging_prefix_and_no_marker(ctx, s3_server, s3_bucket):
    bucket = s3_bucket[len("s3://"):]
    result = rd.range(30, override_num_blocks=3).write_parquet(f"{s3_bucket}/out")
    assert result.rows == 30
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_server).list_objects_v2(
        Bucket=bucket, Prefix="out/").get("Contents", [])]
    assert not [k for k in keys if "_staging" in k], keys
    assert sorted(k for k in keys if k.endswith("_commit.json")) == [
        f"out/p0000{i}/_commit.json" for i in range(3)]
    assert sorted(r["id"] for r in rd.read_parquet(f"{s3_bucket}/out").take_all()) == list(range(30))
