"""Run a user pipeline over one epoch: read the manifest, transform, commit per partition.

The same function, `run_job`, serves the in-process operator and the spark-submit
application (`airflow_streambatch.epochs.spark_app`), both handing it the same
`job.EpochJob`, so both resume the same way: the commit records decide what is left,
the durable epoch record (kept by `epoch_run.EpochRun`) guards against changed inputs
and says what happened, and nothing runs on Spark for a committed partition.
"""

from __future__ import annotations

import functools
import logging
import posixpath
import sys
import warnings
from collections.abc import Callable
from typing import Any

from airflow_streambatch.engine import read_api
from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.dataset import Dataset
from airflow_streambatch.engine.errors import PartialResultWarning
from airflow_streambatch.engine.filesystems import check_disjoint
from airflow_streambatch.engine.read_pruning import check_columns, check_filter, prune_reads
from airflow_streambatch.engine.execution.partitions import WriteResult
from airflow_streambatch.engine.output.target import OutputTarget
from airflow_streambatch.engine.spark.session import get_spark, ship_user_module
from airflow_streambatch.epochs.checkpoint import EpochRecord
from airflow_streambatch.epochs.epoch_run import EpochRun, OnProgress
from airflow_streambatch.epochs.job import EpochJob
from airflow_streambatch.epochs.manifest import EpochManifest
from airflow_streambatch.epochs.outputs import OUTPUT_FORMATS
from airflow_streambatch.epochs.pipeline_ref import load_pipeline

log = logging.getLogger("airflow_streambatch.epochs")

READERS = {
    "parquet": read_api.read_parquet,
    "csv": read_api.read_csv,
    "json": read_api.read_json,
    "text": read_api.read_text,
    # an epoch's binary files keep their ``path`` column, as its fragment reads do (Ray's default is no path)
    "binary_files": functools.partial(read_api.read_binary_files, include_paths=True),
}

Pipeline = Callable[..., Dataset]


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


def run_epoch(manifest: EpochManifest, pipeline: str | Pipeline, *, on_progress: OnProgress | None = None,
              spark_ui_url: str | None = None, **job: Any) -> EpochRecord:
    """`run_job` of ``EpochJob(manifest=manifest, pipeline=pipeline, **job)``: ``job`` takes the keyword
    arguments of `EpochJob` (``output_path`` is required; the defaults are the job's)."""
    return run_job(EpochJob(manifest=manifest, pipeline=pipeline, **job), on_progress=on_progress,
                   spark_ui_url=spark_ui_url)


def run_job(job: EpochJob, *, on_progress: OnProgress | None = None, spark_ui_url: str | None = None) -> EpochRecord:
    """Run ``job.pipeline`` over ``job.manifest`` and commit each input partition to ``job.output_path``:
    a directory, or with ``output_format="delta"``/``"iceberg"`` a table (`outputs.EpochOutput`;
    ``output_options`` are the write's keyword arguments). ``columns`` and ``row_filter``
    (a `pyarrow.compute.Expression`) prune what each partition reads (`read_epoch`).

    Partitions committed by an earlier run are skipped; a failing partition is
    recorded with its error while the others commit (the caller decides whether
    the epoch failed). An epoch whose record says it succeeded runs nothing unless
    ``full_recompute``. Each commit logs "k of N partitions committed" and appends one
    line to the record's journal (``_epoch.log``), so a commit costs O(1) however many
    partitions the epoch has; the whole record (``_epoch.json``) is written when the
    run starts, ends or stops, and ``on_progress`` (which gets the record) follows the
    commits at most every ``epoch_run.PROGRESS_INTERVAL_S`` seconds (the commit records,
    not this record, decide what a retry reruns).

    Whatever stops the run (an error, or an interruption: Airflow's execution_timeout,
    SIGTERM, Ctrl-C) leaves the record saying ``failed`` with the reason, then is
    re-raised; the engine has by then cancelled its Spark jobs and removed its staging
    and blocks.
    """
    check_formats(job.input_format, job.output_format)
    output, manifest = job.output(), job.manifest
    if job.full_recompute and output.is_table:
        raise ValueError(f"full_recompute=True is not supported for {job.output_format} tables ({job.output_path}): "
                         "delete the epoch's rows in the table (its record lists their files), then clear the task")
    check_output_apart(manifest, output.location())
    # one run of an epoch at a time: the record, like the commits, is written only under the output's lease
    with (DataContext.get_current().scoped(**job.data_context),
          OutputTarget.open(output.record_dir(manifest.interval_start, manifest.interval_end)) as target):
        fn = load_pipeline(job.pipeline)
        run = EpochRun(job, output, target, on_progress=on_progress, spark_ui_url=spark_ui_url)
        done = run.start()
        return done if done is not None else _write(run, fn)


def _write(run: EpochRun, fn: Pipeline) -> EpochRecord:
    """The engine's run of the pipeline over the epoch, each partition committed through ``run.commit``."""
    job = run.job
    ctx = DataContext.get_current().copy()  # run_job scoped the job's data_context
    ctx.max_failed_partitions = len(job.manifest.partitions)  # isolate every failure; the epoch reports them
    with ctx.scoped():
        try:
            # a function unpickled by value (@task.streambatch in spark-submit's driver) names a module this
            # process never imported, maybe one no process can (unusual_prefix_<hash>_<file>): its code came along
            if fn.__module__ in sys.modules:
                ship_user_module(get_spark(), fn.__module__)
            inputs = read_epoch(job.manifest, job.input_format, columns=job.columns, row_filter=job.row_filter)
            ds = fn(inputs, job.manifest, **job.pipeline_kwargs)
            if not isinstance(ds, Dataset):
                raise TypeError(f"pipeline {job.pipeline!r} must return an airflow_streambatch Dataset, "
                                f"got {type(ds).__name__}")
            # "resume": commit records decide what is left, so a retry or a Clear runs only what is missing
            with warnings.catch_warnings():  # failed partitions are the epoch record's to report
                warnings.simplefilter("ignore", PartialResultWarning)
                result: WriteResult = run.output.write(ds, run.target, job.manifest, run.commit)
        except BaseException as exc:  # noqa: BLE001 - timeouts and SIGTERM too: the record must not say running
            run.fail(exc)
            raise
    return run.finish(result, ds)
