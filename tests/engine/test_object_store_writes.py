"""Exactly-once output on an object store: a real S3 server process (moto's), real Spark.

Before the output layer, the first commit to ``s3://`` failed (``CopyObject ...
NO_SUCH_KEY``: the commit renamed a directory, and object stores have none). Here every
format and mode is written to the server and read back by a plain directory reader
(pyarrow, which skips ``_``-prefixed paths as Spark and pandas do); drivers are killed
at each step of a commit; two writers race for the lease at the same instant.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from functools import partial

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as sb
from killed_driver import kill_when_flagged
from airflow_streambatch.engine.output.lease import LEASE_FILE, WriteLeaseHeldError, WriteLeaseLostError, acquire
from airflow_streambatch.engine.output.target import OutputTarget

FORMATS = {"parquet": "parquet", "csv": "csv", "json": "json"}


def _fs(uri: str):
    return pafs.FileSystem.from_uri(uri)


def _ids(uri: str, file_format: str = "parquet") -> list[int]:
    """What a plain directory reader sees: every visible file under ``uri``, ``_``-prefixed skipped."""
    fs, root = _fs(uri)
    dataset = pads.dataset(root, filesystem=fs, format=FORMATS[file_format],
                           exclude_invalid_files=False, ignore_prefixes=["_", "."])
    return sorted(dataset.to_table(columns=["id"])["id"].to_pylist())


def _keys(uri: str) -> list[str]:
    fs, root = _fs(uri)
    return sorted(i.path[len(root) + 1:] for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))
                  if i.type == pafs.FileType.File)


@pytest.mark.parametrize("file_format", ["parquet", "csv", "json"])
def test_each_format_commits_on_s3_and_a_plain_reader_sees_every_row_once(ctx, s3_bucket, file_format):
    out = f"{s3_bucket}/out-{file_format}"
    result = getattr(sb.range(40, override_num_blocks=4), f"write_{file_format}")(out, max_rows_per_file=4)
    assert sorted(result.committed) == [0, 1, 2, 3] and result.rows == 40
    assert _ids(out, file_format) == list(range(40))
    keys = _keys(out)
    assert [k for k in keys if k.startswith("_staging/") and not k.endswith("/")] == []  # staging removed
    assert sorted(f"{out}/{k}" for k in keys if k.startswith("p0") and not k.endswith("_commit.json")) == \
        sorted(result.files)  # exactly the committed files are visible


def test_every_mode_on_s3(ctx, s3_bucket):
    out = f"{s3_bucket}/modes"
    ds = sb.range(40, override_num_blocks=4)
    ds.write_parquet(out)
    assert sorted(ds.write_parquet(out, mode="resume").skipped) == [0, 1, 2, 3]
    assert sorted(ds.write_parquet(out, mode="ignore").skipped) == [0, 1, 2, 3]
    with pytest.raises(FileExistsError, match="already holds output"):
        ds.write_parquet(out, mode="error")
    ds.write_parquet(out, mode="append")
    assert _ids(out) == sorted(list(range(40)) * 2)  # append adds a copy, as asked
    with pytest.raises(ValueError, match="partitions of append writes"):
        ds.write_parquet(out, mode="resume")
    ds.write_parquet(out, mode="overwrite")
    assert _ids(out) == list(range(40))


def fail_partition_two(batch, *, flag: str):
    """Rows 20..29 (partition 2) fail while ``flag`` exists (Spark's workers see the same /tmp)."""
    if os.path.exists(flag) and 20 <= min(batch["id"]) < 30:
        raise ValueError("partition two is bad today")
    return batch


def test_a_rerun_of_a_failed_write_never_adds_a_silent_second_copy(ctx, s3_bucket, tmp_path):
    out = f"{s3_bucket}/rerun"
    flag = tmp_path / "fail"
    flag.touch()
    ctx.max_failed_partitions, ctx.max_task_retries = 1, 0
    ds = sb.range(40, override_num_blocks=4).map_batches(partial(fail_partition_two, flag=str(flag)),
                                                         batch_format="numpy")
    with pytest.warns(sb.PartialResultWarning):
        first = ds.write_parquet(out)
    assert sorted(first.committed) == [0, 1, 3] and [f.partition for f in first.failed] == [2]
    flag.unlink()
    with pytest.raises(FileExistsError) as refused:  # before: all 4 partitions appended again (70 rows of 40)
        ds.write_parquet(out)
    for part in ("unfinished write", "3 partition(s) committed", "mode='resume'", "mode='append'"):
        assert part in str(refused.value), (part, str(refused.value))
    assert _ids(out) == [i for i in range(40) if not 20 <= i < 30]
    resumed = ds.write_parquet(out, mode="resume")
    assert sorted(resumed.committed) == [2] and sorted(resumed.skipped) == [0, 1, 3]
    assert _ids(out) == list(range(40))
    assert sorted(ds.write_parquet(out, mode="resume").skipped) == [0, 1, 2, 3]  # finished: nothing left
    ds.write_parquet(out, mode="overwrite")
    assert _ids(out) == list(range(40))


_KILLED_WRITER = """
import os, sys, time
os.environ["PYSPARK_PYTHON"] = sys.executable
import airflow_streambatch.engine as sb
from airflow_streambatch.engine.output import protocols, stores

def hang(step):
    open({flag!r}, "w").write(step)
    time.sleep(3600)  # the test SIGKILLs this driver here

if {step!r} == "before_record":
    create = stores.create
    def create_then_hang(fs, path, data):
        if path.endswith("/_commit.json"):
            hang("before_record")
        return create(fs, path, data)
    stores.create = create_then_hang
else:
    copy = protocols.CopyCommit._copy
    def copy_one_then_hang(self, staged, final, names):
        if {step!r} == "between_files" and len(names) > 1:
            self.fs.copy_file(f"{{staged}}/{{names[0]}}", f"{{final}}/{{names[0]}}")
            hang("between_files")
        copy(self, staged, final, names)
        if {step!r} == "after_files":
            hang("after_files")
    protocols.CopyCommit._copy = copy_one_then_hang

ctx = sb.DataContext(block_dir={blocks!r}, progress_interval_s=0, resources={{"CPU": 2}})
with ctx.scoped():
    sb.range(40, override_num_blocks=4).write_parquet({out!r}, max_rows_per_file=5)
"""


@pytest.mark.parametrize("step", ["before_record", "between_files", "after_files"])
def test_a_driver_killed_at_each_step_of_a_commit_leaves_no_partial_or_duplicate_rows(ctx, s3_bucket, tmp_path,
                                                                                       step):
    out, flag = f"{s3_bucket}/killed-{step}", tmp_path / "at-step"
    script = _KILLED_WRITER.format(flag=str(flag), step=step, blocks=str(tmp_path / "blocks-killed"), out=out)
    kill_when_flagged(script, flag, tmp_path / "writer.log")
    fs, root = _fs(out)
    records = [k for k in _keys(out) if k.endswith("_commit.json")]
    seen = _ids(out) if any(k.endswith(".parquet") and k.startswith("p0") for k in _keys(out)) else []
    assert len(seen) == len(set(seen)), "a reader saw a row twice"
    committed_ids = set()
    for key in records:
        with fs.open_input_stream(f"{root}/{key}") as f:
            record = json.loads(f.read())
        committed_ids |= set(range(10 * record["partition"], 10 * record["partition"] + 10))
    assert set(seen) <= committed_ids, "a reader saw rows of a partition that was never committed"
    if step == "between_files":
        assert len(seen) % 10 == 5, "the kill came between a partition's two files"
    ctx.max_task_retries = 0
    result = sb.range(40, override_num_blocks=4).write_parquet(out, mode="resume", max_rows_per_file=5)
    assert sorted([*result.committed, *result.skipped]) == [0, 1, 2, 3]
    assert _ids(out) == list(range(40))  # the half-copied commit was finished, not committed again
    for key in [k for k in _keys(out) if k.endswith("_commit.json")]:
        with fs.open_input_stream(f"{root}/{key}") as f:
            listed = json.loads(f.read())["files"]
        assert all(fs.get_file_info(f"{root}/{name}").type == pafs.FileType.File for name in listed)


_RACER = """
import sys, time
from airflow_streambatch.engine.output.lease import WriteLeaseHeldError
from airflow_streambatch.engine.output.target import OutputTarget
for n, start in enumerate({starts!r}):
    time.sleep(max(0.0, start - time.time()))
    try:
        target = OutputTarget.open("{bucket}/race-%d" % n, timeout_s=0)
    except WriteLeaseHeldError:
        print(n, "refused", flush=True)
        continue
    print(n, "holds", flush=True)
    time.sleep(1.5)
    target.close()
"""


def test_two_writers_racing_for_the_lease_at_the_same_instant_exactly_one_wins(s3_bucket, tmp_path):
    rounds = 6
    starts = [time.time() + 4 + 2.5 * n for n in range(rounds)]  # both processes start each round together
    racers = [subprocess.Popen([sys.executable, "-c", _RACER.format(starts=starts, bucket=s3_bucket)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [racer.communicate(timeout=120)[0] for racer in racers]
    lines = [line.split() for out in outputs for line in out.splitlines() if line[:1].isdigit()]
    assert len(lines) == 2 * rounds, outputs
    for n in range(rounds):
        assert sorted(word for m, word in lines if int(m) == n) == ["holds", "refused"], outputs


def _lease_object(uri: str, **fields) -> None:
    fs, root = _fs(uri)
    holder = {"host": "worker-7.example", "pid": 4242, "run_id": "abc123", "since": time.time() - 3600,
              "token": "t" * 32, **fields}
    with fs.open_output_stream(f"{root}/{LEASE_FILE}") as out:
        out.write(json.dumps(holder).encode())


def test_a_lease_of_a_writer_that_stopped_renewing_is_taken_over_and_a_live_one_is_not(ctx, s3_bucket):
    live, dead = f"{s3_bucket}/live", f"{s3_bucket}/dead"
    _lease_object(live, expires_at=time.time() + 600)
    with pytest.raises(WriteLeaseHeldError) as refused:
        sb.range(10, override_num_blocks=1).write_parquet(live)
    for part in ("host worker-7.example", "pid 4242", "run abc123", "expires at", "takes it over then"):
        assert part in str(refused.value), (part, str(refused.value))
    _lease_object(dead, expires_at=time.time() - 1)  # its holder died on another host a while ago
    assert sorted(sb.range(10, override_num_blocks=1).write_parquet(dead).committed) == [0]
    assert _ids(dead) == list(range(10))


def test_a_writer_whose_lease_was_taken_over_commits_nothing_more(s3_bucket):
    fs, root = _fs(f"{s3_bucket}/fenced")
    first = acquire(fs, root, "first", timeout_s=0, ttl_s=1.0)
    first._stop.set()  # it hangs: no more renewals
    time.sleep(1.2)
    second = acquire(fs, root, "second", timeout_s=0, ttl_s=30.0)
    with pytest.raises(WriteLeaseLostError, match="no longer this run's"):
        first.check()
    second.check()
    first.release()  # a fenced holder's release leaves the new holder's lease alone
    second.check()
    with pytest.raises(WriteLeaseHeldError):
        acquire(fs, root, "third", timeout_s=0, ttl_s=30.0)
    second.release()
    acquire(fs, root, "third", timeout_s=0, ttl_s=30.0).release()


def epoch_pipeline(ds, epoch, *, flag: str):
    return ds.map_batches(partial(fail_partition_two, flag=flag), batch_format="numpy")


def test_an_epoch_on_s3_reruns_only_its_failed_partition(ctx, s3_bucket, tmp_path):
    from airflow_streambatch.epochs import EpochCheckpoint, EpochManifest, list_inputs, run_epoch

    fs, root = _fs(f"{s3_bucket}/in")
    for i in range(4):
        pq.write_table(pa.table({"id": list(range(10 * i, 10 * i + 10))}), f"{root}/part-{i}.parquet", filesystem=fs)
    manifest = EpochManifest("2026-11-22T10:00:00+00:00", datetime(2026, 11, 22, 11, tzinfo=timezone.utc).isoformat(),
                             list_inputs(f"{s3_bucket}/in"))
    out, flag = f"{s3_bucket}/scores/2026-11-22/10", tmp_path / "fail"
    flag.touch()
    ctx.max_task_retries = 0
    first = run_epoch(manifest, "test_object_store_writes:epoch_pipeline", output_path=out,
                      pipeline_kwargs={"flag": str(flag)})
    assert first.status == "failed" and [p.index for p in first.by_state("failed")] == [2]
    assert "partition two is bad today" in first.partitions[2].error
    flag.unlink()
    second = run_epoch(manifest, "test_object_store_writes:epoch_pipeline", output_path=out,
                       pipeline_kwargs={"flag": str(flag)})
    assert second.status == "succeeded" and second.tries == 2
    assert [p.index for p in second.partitions if p.this_try] == [2]  # only the failed partition ran
    assert _ids(out) == list(range(40))
    assert EpochCheckpoint(out).load().status == "succeeded"


def test_a_target_the_caller_opened_is_handed_to_writes_and_holds_the_lease_between_them(ctx, s3_bucket):
    out = f"{s3_bucket}/held"
    ds = sb.range(20, override_num_blocks=2)
    with OutputTarget.open(out) as target:
        assert sorted(ds.write_parquet(target, mode="resume").committed) == [0, 1]
        with pytest.raises(WriteLeaseHeldError):  # between the writes, the path is still this caller's
            ds.write_parquet(out, mode="resume")
        assert sorted(ds.write_parquet(target, mode="resume").skipped) == [0, 1]
    assert sorted(ds.write_parquet(out, mode="resume").skipped) == [0, 1]  # closed: the lease is free
