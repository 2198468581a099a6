"""Run a user pipeline over one epoch: read the manifest, transform, commit per partition.

The same function serves the in-process operator and the spark-submit application
(`airflow_streambatch.epochs.spark_app`), so both resume the same way: the commit
records decide what is left, the durable epoch record guards against changed inputs
and says what happened, and nothing runs on Spark for a committed partition.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import sys
import time
import warnings
from collections.abc import Callable

from airflow_streambatch.engine import read_api
from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.dataset import Dataset
from airflow_streambatch.engine.errors import PartialResultWarning
from airflow_streambatch.engine.filesystems import check_disjoint
from airflow_streambatch.engine.read_pruning import check_columns, check_filter, prune_reads
from airflow_streambatch.engine.execution.partitions import WriteResult
from airflow_streambatch.engine.output.commit import CommitRecord
from airflow_streambatch.engine.output.target import OutputTarget
from airflow_streambatch.engine.spark.session import get_spark, ship_user_module
from airflow_streambatch.epochs.checkpoint import EpochCheckpoint, EpochRecord, PartitionStatus, stop_reason
from airflow_streambatch.epochs.manifest import EpochManifest
from airflow_streambatch.epochs.outputs import OUTPUT_FORMATS, EpochOutput
from airflow_streambatch.epochs.pipeline_ref import load_pipeline

log = logging.getLogger("airflow_streambatch.epochs")

READERS = {
    "parquet": read_api.read_parquet,
    "csv": read_api.read_csv,
    "json": read_api.read_json,
    "text": read_api.read_text,
    "binary_files": read_api.read_binary_files,
}

Pipeline = Callable[..., Dataset]
# during a run, on_progress (the Task State Store) gets the record at most this often, and so does the
# snapshot ``_epoch.json`` on filesystems that cannot append to its journal (object stores)
PROGRESS_INTERVAL_S = 2.0


def check_formats(input_format: str, output_format: str) -> None:
    if input_format not in READERS:
        raise ValueError(f"input_format={input_format!r} is not one of {sorted(READERS)}")
    if output_format not in OUTPUT_FORMATS:
        raise ValueError(f"output_format={output_format!r} is not one of {list(OUTPUT_FORMATS)}")


def read_epoch(manifest: EpochManifest, input_format: str = "parquet", *, columns: list[str] | None = None,
               row_filter=None) -> Dataset:
    """The epoch's inputs as a Dataset: one input partition per manifest partition, in manifest order.

    A manifest of whole files reads them as before; one with ranges (a large file split
    by the sensor's ``max_partition_bytes``) reads exactly its partitions, so read task
    ``i`` is manifest partition ``i`` on every try. ``columns`` and ``row_filter`` (a
    pyarrow expression) prune every partition's read: inside the Parquet scan, or for the
    other formats on what each read task parses (`engine.read_pruning`); which partitions
    there are, and so the commit records, do not change.
    """
    where = f"read_epoch(input_format={input_format!r})"
    columns, row_filter = check_columns(columns, where), check_filter(row_filter, where, "row_filter")
    if all(p.whole for p in manifest.partitions):
        if input_format == "parquet":
            return read_api.read_parquet(manifest.paths, override_num_blocks=len(manifest.paths), columns=columns,
                                         filter=row_filter)
        ds = READERS[input_format](manifest.paths, override_num_blocks=len(manifest.paths))
        return prune_reads(ds, columns, row_filter, where)
    try:
        return read_api.read_fragments([p.fragment() for p in manifest.partitions], input_format, columns=columns,
                                       filter=row_filter)
    except ValueError as exc:
        raise ValueError(f"epoch {manifest.interval_start}..{manifest.interval_end}: the manifest splits files into "
                         f"ranges that input_format={input_format!r} cannot read ({exc}); use the format the files "
                         "are in, or EpochSensor(max_partition_bytes=None) to keep files whole") from exc


def check_output_apart(manifest: EpochManifest, output_path: str) -> None:
    """Refuse an output path that overlaps the epoch's inputs, before anything is read or deleted.

    The manifest holds files, so their directories count as inputs too: output inside
    the directory the sensor lists would be listed as input by the next try or epoch.
    """
    inputs = dict.fromkeys(path for p in manifest.paths for path in (p, posixpath.dirname(p.rstrip("/"))) if path)
    check_disjoint(list(inputs), output_path,
                   f"epoch {manifest.interval_start}..{manifest.interval_end}: output_path")


def run_epoch(
    manifest: EpochManifest,
    pipeline: str | Pipeline,
    *,
    output_path: str,
    input_format: str = "parquet",
    output_format: str = "parquet",
    output_options: dict | None = None,
    pipeline_kwargs: dict | None = None,
    full_recompute: bool = False,
    context_overrides: dict | None = None,
    on_progress: Callable[[EpochRecord], None] | None = None,
    spark_ui_url: str | None = None,
    columns: list[str] | None = None,
    row_filter=None,
) -> EpochRecord:
    """Run ``pipeline`` over the epoch and commit each input partition to ``output_path``: a
    directory, or with ``output_format="delta"``/``"iceberg"`` a table (`outputs.EpochOutput`;
    ``output_options`` are the write's keyword arguments). ``columns`` and ``row_filter``
    (a `pyarrow.compute.Expression`) prune what each partition reads (`read_epoch`).

    Partitions committed by an earlier run are skipped; a failing partition is
    recorded with its error while the others commit (the caller decides whether
    the epoch failed). An epoch whose record says it succeeded runs nothing unless
    ``full_recompute``. Each commit logs "k of N partitions committed" and appends one
    line to the record's journal (``_epoch.log``), so a commit costs O(1) however many
    partitions the epoch has; the whole record (``_epoch.json``) is written when the
    run starts, ends or stops, and ``on_progress`` (which gets the record) follows the
    commits at most every ``PROGRESS_INTERVAL_S`` seconds (the commit records, not
    this record, decide what a retry reruns).

    Whatever stops the run (an error, or an interruption: Airflow's execution_timeout,
    SIGTERM, Ctrl-C) leaves the record saying ``failed`` with the reason, then is
    re-raised; the engine has by then cancelled its Spark jobs and removed its staging
    and blocks.
    """
    check_formats(input_format, output_format)
    output = EpochOutput(output_path, output_format, output_options or {})
    if full_recompute and output.is_table:
        raise ValueError(f"full_recompute=True is not supported for {output_format} tables ({output_path}): delete "
                         "the epoch's rows in the table (its record lists their files), then clear the task")
    check_output_apart(manifest, output.location())
    # one run of an epoch at a time: the record, like the commits, is written only under the output's lease
    with (DataContext.get_current().scoped(**(context_overrides or {})),
          OutputTarget.open(output.record_dir(manifest.interval_start, manifest.interval_end)) as target):
        return _run_epoch(manifest, pipeline, output, target, input_format, pipeline_kwargs,
                          full_recompute, on_progress, spark_ui_url, (columns, row_filter))


def _run_epoch(manifest, pipeline, output: EpochOutput, target: OutputTarget, input_format, pipeline_kwargs,
               full_recompute, on_progress, spark_ui_url, pruning=(None, None)) -> EpochRecord:
    output_path = output.describe()
    fn = load_pipeline(pipeline)
    checkpoint = EpochCheckpoint(target.path, target.lease)
    previous = checkpoint.validate(manifest, full_recompute)
    if previous is not None and previous.status == "running":  # we hold the lease: that try is not running
        log.warning("try %d of epoch %s..%s stopped without recording why (its record still says running): its "
                    "driver was killed (SIGKILL, the out-of-memory killer, a lost host); resuming from its commits",
                    previous.tries, manifest.interval_start, manifest.interval_end)
    record = EpochRecord.start(manifest, target.path)  # where the record lives: beside a table's, not in it
    record.table = output.describe() if output.is_table else None
    record.tries = (previous.tries if previous else 0) + 1
    if not manifest.partitions:  # a quiet interval: an empty epoch is done, not an error
        log.warning("epoch %s..%s has no input files; committing it empty", manifest.interval_start,
                    manifest.interval_end)
        record.status = "succeeded"
        checkpoint.save(record)
        return record
    committed = output.committed(target, manifest)
    if previous is not None and previous.status == "succeeded" and len(committed) == len(manifest.partitions):
        log.info("epoch %s..%s already committed all %d partitions to %s; nothing to rerun "
                 "(set full_recompute=True to recompute it)", manifest.interval_start, manifest.interval_end,
                 len(committed), output_path)
        for status in previous.partitions:
            status.this_try = False
        return previous
    manifest.verify_unchanged()

    record.spark_ui_url = spark_ui_url
    for index, rec in committed.items():
        if index < len(record.partitions):
            record.partitions[index] = PartitionStatus.committed(index, rec, this_try=False)
    checkpoint.save(record)
    log.info("epoch %s..%s: %d partitions, %d committed by earlier tries, running the rest into %s",
             manifest.interval_start, manifest.interval_end, len(manifest.partitions), len(committed), output_path)

    total = len(manifest.partitions)
    now = time.monotonic()
    progress = {"committed": sum(p.state == "committed" for p in record.partitions), "published": now,
                "saved": now, "bookkeeping_s": 0.0}

    def committed_now(rec: CommitRecord) -> None:
        started = time.perf_counter()
        if record.partitions[rec.partition].state != "committed":
            progress["committed"] += 1
        status = PartitionStatus.committed(rec.partition, rec, this_try=True)
        record.partitions[rec.partition] = status
        log.info("epoch %s..%s: %d of %d partitions committed (partition %d, %s: %d rows, %d bytes)",
                 manifest.interval_start, manifest.interval_end, progress["committed"], total, rec.partition,
                 rec.label, rec.rows, rec.bytes)
        now = time.monotonic()
        if not checkpoint.append(record, status) and now - progress["saved"] >= PROGRESS_INTERVAL_S:
            checkpoint.save(record)  # no journal on this filesystem: a snapshot now and then instead
            progress["saved"] = now
        if on_progress is not None and now - progress["published"] >= PROGRESS_INTERVAL_S:
            on_progress(record)
            progress["published"] = now
        progress["bookkeeping_s"] += time.perf_counter() - started

    ctx = DataContext.get_current().copy()  # run_epoch scoped context_overrides
    ctx.max_failed_partitions = len(manifest.partitions)  # isolate every failure; the epoch reports them
    with ctx.scoped():
        try:
            # a function unpickled by value (@task.streambatch in spark-submit's driver) names a module this
            # process never imported, maybe one no process can (unusual_prefix_<hash>_<file>): its code came along
            if fn.__module__ in sys.modules:
                ship_user_module(get_spark(), fn.__module__)
            columns, row_filter = pruning
            inputs = read_epoch(manifest, input_format, columns=columns, row_filter=row_filter)
            ds = fn(inputs, manifest, **(pipeline_kwargs or {}))
            if not isinstance(ds, Dataset):
                raise TypeError(f"pipeline {pipeline!r} must return an airflow_streambatch Dataset, "
                                f"got {type(ds).__name__}")
            # "resume": commit records decide what is left, so a retry or a Clear runs only what is missing
            with warnings.catch_warnings():  # failed partitions are the epoch record's to report
                warnings.simplefilter("ignore", PartialResultWarning)
                result: WriteResult = output.write(ds, target, manifest, committed_now)
        except BaseException as exc:  # noqa: BLE001 - timeouts and SIGTERM too: the record must not say running
            record.status, record.reason = "failed", stop_reason(exc)
            log.error("epoch %s..%s stopped: %s", manifest.interval_start, manifest.interval_end, record.reason)
            checkpoint.save(record)
            if on_progress is not None:
                with contextlib.suppress(Exception):  # the task state store is for the UI: never mask the cause
                    on_progress(record)
            raise

    for failure in result.failed:
        record.partitions[failure.partition] = PartitionStatus.failed(failure.partition, failure)
    record.status = "failed" if record.by_state("failed") or record.by_state("pending") else "succeeded"
    record.metrics = _metrics(ds)
    # the epoch layer's own time within the engine's run (journal, log line, progress): W9 reports it
    record.metrics["commit_bookkeeping_s"] = round(progress["bookkeeping_s"], 4)
    checkpoint.save(record)
    return record


def _metrics(ds: Dataset) -> dict:
    stats = ds.last_run_stats
    if stats is None:
        return {}
    return {
        "wall_s": round(stats.wall_s, 3),
        "peak_buffered_bytes": stats.peak_memory_bytes,
        "spark_jobs": len(stats.launch_log),
        "operators": [
            {"name": op.name, "tasks": op.tasks_done, "tasks_rerun": op.tasks_rerun,
             "tasks_retried": op.tasks_retried, "rows": op.rows_out,
             "bytes": op.bytes_out, "files": op.files_out, "wall_s": round(op.wall_s, 3),
             "task_s": round(op.work_s, 3)}
            for op in stats.ops
        ],
    }
