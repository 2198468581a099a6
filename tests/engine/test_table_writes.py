"""Delta and Iceberg tables on a real S3 server (moto's process), written by real Spark.

Exactly once per input partition: a failed partition is resumed alone, a commit whose
answer was lost is settled by the markers (not committed again), a driver killed before
or after a table commit leaves the table exact after a resume, and two writers of the
same key at once commit each partition once. Readers: delta-rs and pyiceberg scans, and
pyarrow over the files each table lists.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial

import pyarrow as pa
import pyarrow.fs  # noqa: F401 - pa.fs
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as sb
from killed_driver import kill_when_flagged
from airflow_streambatch.engine.output.delta import DeltaFormat, default_storage_options
from airflow_streambatch.engine.output.iceberg import IcebergFormat

ROWS, PARTS = 40, 4


@pytest.fixture(params=["delta", "iceberg"])
def table(request, s3_bucket, tmp_path):
    """A write target on the S3 server: (format, arguments of write_<format>, reader of its rows)."""
    if request.param == "delta":
        uri = f"{s3_bucket}/delta/scores"
        return "delta", {"path": uri}, partial(_delta_ids, uri)
    catalog = {"name": "tests", "type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
               "warehouse": f"{s3_bucket}/warehouse"}
    from pyiceberg.catalog import load_catalog

    kwargs = dict(catalog)
    cat = load_catalog(kwargs.pop("name"), **kwargs, **{"s3.endpoint": os.environ["AWS_ENDPOINT_URL"]})
    cat.create_namespace("db")
    cat.create_table("db.scores", schema=pa.schema([("id", pa.int64())]))  # as in Ray Data, the table must exist
    return "iceberg", {"table_identifier": "db.scores", "catalog_kwargs": catalog}, partial(_iceberg_ids, catalog)


def _plain_readers(files: list[str]) -> list[int]:
    """The ids that pandas, Polars and DuckDB read from the files a table lists: each must agree."""
    import duckdb
    import pandas as pd
    import polars as pl

    fs, _ = pa.fs.FileSystem.from_uri(files[0]) if files else (None, None)
    local = []
    for n, uri in enumerate(files):  # DuckDB and Polars get local copies: no S3 extension or credentials here
        target = f"{_READ_DIR}/{n}.parquet"
        with fs.open_input_file(pa.fs.FileSystem.from_uri(uri)[1]) as src, open(target, "wb") as dst:
            dst.write(src.read())
        local.append(target)
    by_pandas = sorted(i for f in local for i in pd.read_parquet(f, columns=["id"])["id"].tolist())
    by_polars = sorted(pl.read_parquet(local, columns=["id"])["id"].to_list()) if local else []
    by_duckdb = sorted(r[0] for r in duckdb.sql(f"SELECT id FROM read_parquet({local!r})").fetchall()) if local else []
    assert by_pandas == by_polars == by_duckdb
    for f in local:
        os.remove(f)
    return by_pandas


_READ_DIR = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"streambatch-table-reads-{os.getpid()}")
os.makedirs(_READ_DIR, mode=0o700, exist_ok=True)


def _delta_ids(uri: str) -> list[int]:
    from deltalake import DeltaTable

    table = DeltaTable(uri, storage_options=default_storage_options(uri))
    scanned = sorted(table.to_pyarrow_table(columns=["id"])["id"].to_pylist())
    assert scanned == _plain_readers(table.file_uris())  # plain readers of the listed files see what the scan sees
    return scanned


def _iceberg_ids(catalog: dict) -> list[int]:
    table = IcebergFormat("db.scores", catalog).catalog.load_table("db.scores")
    scanned = sorted(table.scan().to_arrow()["id"].to_pylist())
    assert scanned == _plain_readers([task.file.file_path for task in table.scan().plan_files()])
    return scanned


def _write(kind: str, args: dict, ds, **kwargs):
    return getattr(ds, f"write_{kind}")(**args, **kwargs)


def _versions(kind: str, args: dict) -> int:
    """Transactions in the table's history: Delta versions, Iceberg snapshots."""
    if kind == "delta":
        from deltalake import DeltaTable

        return len(DeltaTable(args["path"], storage_options=default_storage_options(args["path"])).history())
    return len(IcebergFormat(args["table_identifier"], args["catalog_kwargs"]).catalog.load_table(
        args["table_identifier"]).snapshots())


def test_a_table_write_commits_its_partitions_in_one_transaction_and_resumes_to_nothing(ctx, table):
    kind, args, ids = table
    result = _write(kind, args, sb.range(ROWS, override_num_blocks=PARTS), mode="resume")
    assert sorted(result.committed) == list(range(PARTS)) and ids() == list(range(ROWS))
    assert _versions(kind, args) == 1  # all partitions in one transaction (the interval had not passed)
    again = _write(kind, args, sb.range(ROWS, override_num_blocks=PARTS), mode="resume")
    assert again.committed == {} and sorted(again.skipped) == list(range(PARTS))
    assert ids() == list(range(ROWS)) and _versions(kind, args) == 1


def test_an_interval_of_zero_commits_every_partition_alone(ctx, table):
    kind, args, ids = table
    ctx.table_commit_interval_s = 0
    _write(kind, args, sb.range(ROWS, override_num_blocks=PARTS), mode="resume")
    assert _versions(kind, args) == PARTS and ids() == list(range(ROWS))


def fail_partition_two(batch, *, flag: str):
    if os.path.exists(flag) and 20 <= min(batch["id"]) < 30:
        raise ValueError("partition two is bad today")
    return batch


def test_a_failed_partition_is_resumed_alone(ctx, table, tmp_path):
    kind, args, ids = table
    flag = tmp_path / "fail"
    flag.touch()
    ctx.max_failed_partitions, ctx.max_task_retries = 1, 0
    ds = sb.range(ROWS, override_num_blocks=PARTS).map_batches(partial(fail_partition_two, flag=str(flag)),
                                                              batch_format="numpy")
    with pytest.warns(sb.PartialResultWarning):
        first = _write(kind, args, ds, mode="resume")
    assert sorted(first.committed) == [0, 1, 3] and ids() == [i for i in range(ROWS) if not 20 <= i < 30]
    flag.unlink()
    second = _write(kind, args, ds, mode="resume")
    assert sorted(second.committed) == [2] and sorted(second.skipped) == [0, 1, 3]
    assert ids() == list(range(ROWS))


def test_a_commit_whose_answer_is_lost_is_settled_by_its_markers(ctx, table, monkeypatch):
    kind, args, ids = table
    cls = {"delta": DeltaFormat, "iceberg": IcebergFormat}[kind]
    commit, calls = cls.commit, []

    def commit_then_lose_the_answer(self, key, batch):
        calls.append(len(batch))
        commit(self, key, batch)
        if len(calls) == 1:
            raise TimeoutError("the catalog did not answer in time")

    monkeypatch.setattr(cls, "commit", commit_then_lose_the_answer)  # in the driver, over the real table
    result = _write(kind, args, sb.range(ROWS, override_num_blocks=PARTS), mode="resume")
    assert calls == [PARTS]  # never committed a second time
    assert sorted(result.committed) == list(range(PARTS)) and ids() == list(range(ROWS))
    assert _versions(kind, args) == 1


_KILLED_WRITER = """
import os, sys, time
os.environ["PYSPARK_PYTHON"] = sys.executable
import airflow_streambatch.engine as sb
from airflow_streambatch.engine.output.delta import DeltaFormat
from airflow_streambatch.engine.output.iceberg import IcebergFormat

cls = DeltaFormat if {kind!r} == "delta" else IcebergFormat
commit = cls.commit
def commit_and_hang(self, key, batch):
    if {after!r}:
        commit(self, key, batch)
    open({flag!r}, "w").write("at the commit")
    time.sleep(3600)  # the test SIGKILLs this driver here
cls.commit = commit_and_hang
ctx = sb.DataContext(block_dir={blocks!r}, progress_interval_s=0, resources={{"CPU": 2}})
with ctx.scoped():
    getattr(sb.range({rows}, override_num_blocks={parts}), "write_" + {kind!r})(**{args!r}, mode="resume")
"""


@pytest.mark.parametrize("after", [False, True], ids=["before_the_commit", "after_the_commit"])
def test_a_driver_killed_at_a_table_commit_leaves_the_table_exact_after_a_resume(ctx, table, tmp_path, after):
    kind, args, ids = table
    flag = tmp_path / "at-commit"
    script = _KILLED_WRITER.format(kind=kind, after=after, flag=str(flag), blocks=str(tmp_path / "blocks-killed"),
                                   rows=ROWS, parts=PARTS, args=args)
    kill_when_flagged(script, flag, tmp_path / "writer.log")
    if after:
        assert ids() == list(range(ROWS))  # the transaction landed; its driver never learned it
    result = _write(kind, args, sb.range(ROWS, override_num_blocks=PARTS), mode="resume")
    assert sorted([*result.committed, *result.skipped]) == list(range(PARTS))
    assert (result.committed == {}) is after  # settled by the markers, not committed again
    assert ids() == list(range(ROWS))


_RESUMER = """
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
import airflow_streambatch.engine as sb
ctx = sb.DataContext(block_dir={blocks!r}, progress_interval_s=0, resources={{"CPU": 1}}, table_commit_interval_s=0)
with ctx.scoped():
    result = sb.range({rows}, override_num_blocks={parts}).write_delta({path!r}, mode="resume")
print("committed", sorted(result.committed), "skipped", sorted(result.skipped), flush=True)
"""


def test_two_resumes_of_one_delta_write_at_once_commit_each_partition_once(s3_bucket, tmp_path):
    path = f"{s3_bucket}/delta/raced"
    writers = [subprocess.Popen([sys.executable, "-c", _RESUMER.format(blocks=str(tmp_path / f"blocks-{n}"),
                                                                       rows=ROWS * 2, parts=PARTS * 2, path=path)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for n in range(2)]
    outputs = [w.communicate(timeout=300)[0] for w in writers]
    assert all(w.returncode == 0 for w in writers), [o[-3000:] for o in outputs]
    assert _delta_ids(path) == list(range(ROWS * 2)), outputs  # each partition once, whoever committed it


def epoch_pipeline(ds, epoch, *, flag: str):
    return ds.map_batches(partial(fail_partition_two, flag=flag), batch_format="numpy")


def test_epochs_into_one_table_rerun_only_their_failed_partitions(ctx, table, s3_bucket, tmp_path):
    from datetime import datetime, timedelta, timezone

    from airflow_streambatch.epochs import EpochManifest, list_inputs, run_epoch

    kind, args, ids = table
    path, options = (args["path"], {}) if kind == "delta" else (args["table_identifier"],
                                                               {"catalog_kwargs": args["catalog_kwargs"]})
    fs, bucket = pa.fs.FileSystem.from_uri(s3_bucket)
    start = datetime(2026, 11, 22, 10, tzinfo=timezone.utc)
    manifests = []
    for hour in range(2):  # two hourly epochs of 4 files, ids 0..39 then 40..79
        for i in range(PARTS):
            first = ROWS * hour + 10 * i
            pq.write_table(pa.table({"id": list(range(first, first + 10))}), f"{bucket}/in/{hour}/part-{i}.parquet",
                           filesystem=fs)
        manifests.append(EpochManifest((start + timedelta(hours=hour)).isoformat(),
                                       (start + timedelta(hours=hour + 1)).isoformat(),
                                       list_inputs(f"{s3_bucket}/in/{hour}")))
    flag = tmp_path / "fail"
    flag.touch()
    ctx.max_task_retries = 0
    run = partial(run_epoch, pipeline="test_table_writes:epoch_pipeline", output_path=path, output_format=kind,
                  output_options=options, pipeline_kwargs={"flag": str(flag)})
    first = run(manifests[0])
    assert first.status == "failed" and [p.index for p in first.by_state("failed")] == [2]
    assert run(manifests[1]).status == "succeeded"  # ids 40..79: none fails
    flag.unlink()
    again = run(manifests[0])
    assert again.status == "succeeded" and [p.index for p in again.partitions if p.this_try] == [2]
    assert run(manifests[0]).status == "succeeded"  # a Clear after success commits nothing more
    assert ids() == list(range(2 * ROWS))
    with pytest.raises(ValueError, match="full_recompute=True is not supported"):
        run(manifests[0], full_recompute=True)


def test_a_commit_built_on_a_table_version_that_moved_fails_instead_of_duplicating(ctx, table, monkeypatch):
    """Writer A read the markers on version v (none for partition 0); writer B committed partition 0
    since. A's commit of partition 0 on v must fail (A then reads the markers again and drops it),
    never be rebased onto B's."""
    from airflow_streambatch.engine.output.commit import CommitRecord
    from airflow_streambatch.engine.output.tables import Pending
    from airflow_streambatch.engine.protocol.staging import StagedFile, schema_columns

    kind, args, ids = table
    _write(kind, args, sb.range(10, override_num_blocks=1), mode="resume", idempotence_key="seed")  # a table
    fmt = DeltaFormat(args["path"]) if kind == "delta" else IcebergFormat("db.scores", args["catalog_kwargs"])
    fs, data = pa.fs.FileSystem.from_uri(fmt.data_path())

    def pending(run: str) -> Pending:
        name = f"part-{run}-p00000-00000.parquet"
        rows = pa.table({"id": pa.array(range(100, 110), pa.int64())})
        pq.write_table(rows, f"{data}/{name}", filesystem=fs)
        staged = StagedFile(f"{data}/{name}", 10, fs.get_file_info(f"{data}/{name}").size, schema_columns(rows.schema))
        return Pending(CommitRecord(0, "p0", [name], 10, staged.bytes, run), [staged])

    stale = fmt._table() if kind == "delta" else fmt.catalog.load_table("db.scores")  # A reads version v
    fmt.commit("raced", [pending("writer-b")])  # B commits partition 0
    module = sys.modules[type(fmt).__module__]
    monkeypatch.setattr(module, "_markers_of", lambda table, key: {})  # A's check ran before B's commit
    if kind == "delta":
        monkeypatch.setattr(fmt, "_table", lambda: stale)
    else:
        monkeypatch.setattr(fmt.catalog, "load_table", lambda identifier: stale)
    with pytest.raises(Exception) as failed:  # A, on version v
        fmt.commit("raced", [pending("writer-a")])
    assert "AlreadyCommitted" not in type(failed.value).__name__  # the table refused it
    assert sorted(ids()) == list(range(10)) + list(range(100, 110))  # partition 0 of "raced" once
