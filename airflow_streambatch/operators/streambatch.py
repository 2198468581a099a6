"""StreamBatchOperator: run a pipeline over one epoch, commit per input partition, retry only what failed."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator, XComArg
from airflow.sdk.exceptions import AirflowException

from airflow_streambatch.engine.context import DataContext, is_templated
from airflow_streambatch.engine.filesystems import check_disjoint
from airflow_streambatch.engine.read_pruning import check_columns, check_filter
from airflow_streambatch.epochs.checkpoint import EpochCheckpoint, EpochRecord, as_uri, record_uri
from airflow_streambatch.epochs.job import EpochJob
from airflow_streambatch.epochs.outputs import EpochOutput
from airflow_streambatch.epochs.manifest import DEFAULT_MAX_PARTITION_BYTES, EpochManifest, list_inputs
from airflow_streambatch.epochs.manifest_store import manifest_from_xcom
from airflow_streambatch.epochs.pipeline_ref import check_pipeline_ref
from airflow_streambatch.epochs.runner import check_formats, check_output_apart
from airflow_streambatch.epochs.sensing import epoch_interval
from airflow_streambatch.epochs.states import EpochState, PartitionState
from airflow_streambatch.epochs.summary import MAX_FAILED_SHOWN, epoch_summary
from airflow_streambatch.hooks.streambatch import StreamBatchHook
from airflow_streambatch.operators.asset_partitions import emit_epoch_event
from airflow_streambatch.operators.deploy_modes import DEPLOY_MODES
from airflow_streambatch.operators.epoch_log import log_earlier_progress, log_outcome
from airflow_streambatch.operators.lineage import StreamBatchLineageMixin
from airflow_streambatch.operators.links import EpochOutputLink, SparkUILink
from airflow_streambatch.operators.metrics import epoch_metrics

if TYPE_CHECKING:
    from airflow.sdk import Context

STATE_KEY = "epoch_progress"  # Task State Store: the bounded epoch summary (counts, first failures, pointers)


class EpochPartitionsFailed(AirflowException):
    """Some input partitions of the epoch failed; the others are committed and kept."""

    def __init__(self, record: EpochRecord, task_id: str, dag_id: str):
        self.record = record
        failed = record.by_state(PartitionState.FAILED) + record.by_state(PartitionState.PENDING)
        committed = record.by_state(PartitionState.COMMITTED)
        lines = "\n".join(f"  - partition {p.index} ({p.path}) in {p.operator}: {p.error}"
                          if p.state == PartitionState.FAILED else f"  - partition {p.index} ({p.path}): did not finish"
                          for p in failed[:MAX_FAILED_SHOWN])
        if len(failed) > MAX_FAILED_SHOWN:  # the message is the task's error: bounded like its XCom
            lines += (f"\n  ... and {len(failed) - MAX_FAILED_SHOWN} more, listed with their errors in "
                      f"{record_uri(record.output_path)}")
        super().__init__(
            f"{len(failed)} of {len(record.partitions)} input partition(s) of epoch {record.epoch['interval_start']}.."
            f"{record.epoch['interval_end']} failed ({len(committed)} committed to {record.output_path} and kept):\n"
            f"{lines}\n"
            f"Clearing task {task_id} (Airflow UI: Clear; REST: POST /api/v2/dags/{dag_id}/clearTaskInstances), "
            f"or its next retry, reruns only these {len(failed)} partition(s)."
        )


def _known_at_run_time(value: Any) -> bool:
    """A template string or an XCom (another task's output): Airflow gives its value only when the task runs."""
    return (isinstance(value, str) and is_templated(value)) or isinstance(value, XComArg)


class StreamBatchOperator(StreamBatchLineageMixin, BaseOperator):
    """Runs a streaming-batch pipeline over an epoch's inputs on Spark and commits each input partition once.

    The pipeline is an importable function ``fn(ds, epoch, **pipeline_kwargs)`` that
    gets the epoch's input `Dataset` (one partition per manifest partition: a file, or
    a range of a large one: Parquet row groups, or the lines of a byte range) and the
    `EpochManifest`, and returns the transformed Dataset; the operator writes it to
    ``output_path`` with a sink that commits per input partition exactly once.

    A failed partition fails the task with a message naming it; the rest stay
    committed. Clearing the task (or its retry) runs only the partitions without a
    commit record, starting no Spark work for the others. Clearing a task that
    succeeded reruns nothing unless ``full_recompute=True``.

    :param pipeline: ``"module:function"`` (templated) or the function itself.
    :param output_path: the epoch's output directory, e.g. ``/data/out/{{ ds }}`` (templated); with
        ``output_format="delta"`` the Delta table's URI, with ``"iceberg"`` the table's identifier
        (``db.scores``): every epoch goes into the same table, its record and lease beside it in
        ``<table location>/_streambatch/epochs/<interval>/``.
    :param manifest: the epoch manifest, usually ``EpochSensor(...).output`` (templated): the
        sensor's pointer to the manifest it wrote (read here and checked against its
        fingerprint), or a whole manifest dict. Without it, the files under ``input_path``
        are listed when the task first runs and frozen in ``<output_path>/_epoch.json``
        for its retries.
    :param input_path: the input directory or glob, when no manifest is given (templated).
    :param max_partition_bytes: with ``input_path``, files larger than this become ranges of
        about this size (Parquet row groups, or byte ranges of a line-based file's lines), one
        partition (read task, retry, commit) each, as `EpochSensor` does; ``None`` keeps one
        partition per file. Default 128 MiB.
    :param input_format: ``parquet`` (default), ``csv``, ``json``, ``text`` or ``binary_files``.
    :param output_format: ``parquet`` (default), ``json``, ``csv``, ``delta`` or ``iceberg``.
    :param output_options: keyword arguments of the write (templated): ``compression`` for
        Parquet, ``storage_options`` for Delta, ``catalog_kwargs`` and ``snapshot_properties``
        for Iceberg.
    :param pipeline_kwargs: keyword arguments for the pipeline function (templated).
    :param streambatch_conn_id: a Spark connection (master in host); None runs embedded local Spark.
    :param storage_conn_id: the Airflow connection whose credentials read and write the object store
        (``s3://``, ``gs://``, Azure): type ``aws``, ``google_cloud_platform``, ``wasb``, ``adls`` or
        ``azure_data_lake``, or a Spark connection with a ``storage`` extra. They reach this task's
        process for the epoch and Spark's executors, never a command line, and are masked in logs.
        None: the Spark connection's ``storage`` extra if it has one, else the processes' environment.
    :param deploy_mode: ``in_process`` (the Spark driver runs in this task) or ``spark_submit``.
    :param spark_conf: Spark properties on top of the connection's (templated).
    :param data_context: `DataContext` settings for the run, e.g. ``{"memory_limit": 2 << 30}`` (templated).
    :param full_recompute: delete the epoch's committed output and recompute every partition
        (templated: ``"{{ params.full_recompute }}"`` lets a manual trigger ask for it).
    :param output_asset: the Asset this output is; each committed epoch emits an event with its summary.
    :param output_asset_partitioned: the event carries the epoch's partition key (for `PartitionedAssetTimetable`).
    :param columns: the input columns the pipeline gets, in this order (templated; None: all).
    :param row_filter: only input rows where this `pyarrow.compute.Expression` holds, e.g.
        ``pc.field("lang") == "en"`` (not templated); it may name columns ``columns`` leaves out.
        Parquet: both go into the scan (other columns not decoded, row groups whose statistics
        exclude the filter not fetched); other formats: applied to each table in the read task.
        Each partition still commits once. spark_submit: pickled in the 0600 spec file.
    """

    template_fields: Sequence[str] = ("pipeline", "output_path", "manifest", "input_path", "pipeline_kwargs",
                                      "spark_conf", "data_context", "full_recompute", "output_options", "columns")
    template_fields_renderers = {"manifest": "json", "pipeline_kwargs": "json", "spark_conf": "json",
                                 "data_context": "json", "output_options": "json"}
    operator_extra_links = (SparkUILink(), EpochOutputLink())
    ui_color = "#fdf0d5"
    pipeline_by_value = False  # True: spark_submit ships a function object itself (@task.streambatch)

    def __init__(self, *, pipeline: Any, output_path: str, manifest: dict | str | None = None,
                 input_path: str | None = None, input_format: str = "parquet", output_format: str = "parquet",
                 pipeline_kwargs: dict | None = None, streambatch_conn_id: str | None = None,
                 deploy_mode: str = "in_process", spark_conf: dict | None = None, data_context: dict | None = None,
                 full_recompute: bool = False, output_asset: Asset | None = None,
                 max_partition_bytes: int | None = DEFAULT_MAX_PARTITION_BYTES, storage_conn_id: str | None = None,
                 output_options: dict | None = None, columns: list[str] | str | None = None, row_filter=None,
                 output_asset_partitioned: bool = False, **kwargs: Any) -> None:
        if output_asset is not None:
            kwargs["outlets"] = [*(kwargs.get("outlets") or []), output_asset]
        super().__init__(**kwargs)
        check_formats(input_format, output_format)
        if deploy_mode not in DEPLOY_MODES:
            raise ValueError(f"StreamBatchOperator(deploy_mode={deploy_mode!r}) must be one of {tuple(DEPLOY_MODES)}")
        if deploy_mode == "spark_submit" and not isinstance(pipeline, str) and not self.pipeline_by_value:
            raise ValueError("deploy_mode='spark_submit' runs the pipeline in another process: pass it as "
                             "'module:function', not a function object")
        self.pipeline = pipeline
        self.output_path = output_path
        self.manifest = manifest
        self.input_path = input_path
        self.max_partition_bytes = max_partition_bytes
        self.input_format = input_format
        self.output_format = output_format
        self.output_options = output_options or {}
        self.pipeline_kwargs = pipeline_kwargs or {}
        self.streambatch_conn_id = streambatch_conn_id
        self.storage_conn_id = storage_conn_id
        self.deploy_mode = deploy_mode
        self.spark_conf = spark_conf or {}
        self.data_context = data_context or {}
        self.full_recompute = full_recompute
        self.output_asset, self.output_asset_partitioned = output_asset, output_asset_partitioned
        where = f"StreamBatchOperator {self.task_id}"  # read pruning: checked now unless columns is a template
        self.columns = columns if isinstance(columns, str) and "{{" in columns else check_columns(columns, where)
        self.row_filter = check_filter(row_filter, where, "row_filter")
        self._check_arguments(rendered=False)  # a mistake fails the DAG's import, not the task hours later

    def _check_arguments(self, rendered: bool) -> None:
        """Check the pipeline reference's form and every ``data_context`` key and value, naming the argument
        and the fix: when the DAG file is parsed (``rendered=False``; a template's or an XCom's value is not
        known yet and waits) and in ``execute`` once everything is rendered. Nothing is imported: importing
        the pipeline's module (its models, torch) on every parse would slow the DAG processor down, so
        ``execute`` does that, before Spark starts."""
        try:
            if rendered or not _known_at_run_time(self.pipeline):
                fileloc = getattr(self.dag, "fileloc", None) if self.has_dag() else None
                check_pipeline_ref(self.pipeline, dag_folder=os.path.dirname(fileloc) if fileloc else None)
            if rendered:  # a template rendered without native objects gives strings: "2147483648", "True"
                self.data_context = DataContext.check_settings(self.data_context, parse_strings=True)
            elif not _known_at_run_time(self.data_context):
                DataContext.check_settings(self.data_context, skip_templated=True)
        except ValueError as exc:
            raise ValueError(f"StreamBatchOperator {self.task_id}: {exc}") from None

    @cached_property
    def _output(self) -> EpochOutput:
        """Where the rows go (rendered: built at run time)."""
        return EpochOutput(self.output_path, self.output_format, self.output_options)

    @cached_property
    def hook(self) -> StreamBatchHook:
        return StreamBatchHook(self.streambatch_conn_id, spark_conf=self.spark_conf,
                               app_name=f"streambatch-{self.dag_id}-{self.task_id}",
                               storage_conn_id=self.storage_conn_id)

    # -- execution ------------------------------------------------------------------
    def execute(self, context: Context) -> dict:
        self._check_arguments(rendered=True)
        self._executing = True  # on_kill turns a SIGTERM into an exception only while the epoch runs
        try:
            # the store's credentials for everything that reads or writes it: listings, the manifest, Spark, records
            with self.hook.object_store_credentials(), epoch_metrics(self):  # metrics: however the run ends
                return self._execute(context)
        finally:
            self._executing = False

    def _execute(self, context: Context) -> dict:
        # every XCom the links read exists from the start: Airflow reads the links when the try ends, and
        # a missing one is an "XCom not found" ERROR in the task log (the Spark UI's is set once Spark runs)
        output = self._output
        start, end = epoch_interval(context)
        EpochOutputLink.persist(context, output_uri=as_uri(output.record_dir(start, end)))
        SparkUILink.persist(context, url=None)
        if isinstance(self.full_recompute, str):  # rendered from a template without native rendering
            self.full_recompute = self.full_recompute.strip().lower() in ("true", "1", "yes")
        if self.input_path:  # run_epoch checks the manifest's files; the listed directory is an input too
            check_disjoint([self.input_path], output.location(), f"{self.task_id}: output_path")
        manifest = self._lineage_manifest = self._epoch_manifest(context)  # OpenLineage: the inputs, once known
        self._record_dir = output.record_dir(manifest.interval_start, manifest.interval_end)
        check_output_apart(manifest, output.location())  # here too: spark-submit's log is not the task's error
        ti = context["ti"]
        store = context.get("task_state_store")
        log_earlier_progress(self.log, store.get(STATE_KEY) if store is not None else None, manifest,
                             self.output_path)
        record = DEPLOY_MODES[self.deploy_mode](self).run(context, self._epoch_job(manifest),
                                                          on_progress=lambda r: self._save_progress(store, r))
        self._epoch_record = record  # what epoch_metrics sends and OpenLineage reports
        self._save_progress(store, record)
        log_outcome(self.log, record)
        # bounded: counts, the first failures and where the record and manifest are (not the record itself)
        result = epoch_summary(record, manifest_uri=self._manifest_uri)
        if record.status != EpochState.SUCCEEDED:
            ti.xcom_push(key="return_value", value=result)  # the outcome, failures included
            raise EpochPartitionsFailed(record, self.task_id, self.dag_id)
        if self.output_asset is not None:
            emit_epoch_event(context, self.output_asset, record, self.output_asset_partitioned)
        return result

    # -- interruption: execution_timeout, mark failed, a stopped worker -----------------
    def on_kill(self) -> None:
        """Cancel the epoch's Spark work; on SIGTERM, also stop ``execute`` with an exception.

        Airflow 3.3's task process calls this from its SIGTERM handler (mark failed,
        a clear of a running task, a stopped worker; SIGKILL follows 5 s later) and
        after an execution_timeout's `AirflowTaskTimeout` has left ``execute``. The
        SIGTERM handler does nothing else, so without an exception here the epoch
        would run on until SIGKILL, leaving its record saying ``running`` and its
        staging and blocks behind. Raising `SystemExit` inside ``execute`` makes the
        engine clean up and the epoch record say why it failed; Airflow treats it as
        a failure that its retries apply to (a stopped worker's epoch resumes on the
        retry), while a task marked failed stays failed.
        """
        DEPLOY_MODES[self.deploy_mode](self).stop()
        if getattr(self, "_executing", False):
            self._executing = False
            raise SystemExit(f"task {self.task_id} received SIGTERM while its epoch ran: Spark jobs cancelled")

    def _driver_pipeline(self) -> str | dict:
        """The pipeline as the spark-submit spec carries it: the ``"module:function"`` reference its driver
        imports (`decorators.streambatch` ships the function itself instead)."""
        return self.pipeline

    def _epoch_job(self, manifest: EpochManifest) -> EpochJob:
        """The epoch run the rendered arguments ask for, as both deploy modes hand it to the runner."""
        return EpochJob(pipeline=self.pipeline, manifest=manifest, manifest_uri=self._manifest_uri,
                        output_path=self.output_path, input_format=self.input_format, output_format=self.output_format,
                        output_options=self.output_options, pipeline_kwargs=self.pipeline_kwargs,
                        full_recompute=self.full_recompute, app_name=self.hook.app_name, row_filter=self.row_filter,
                        columns=check_columns(self.columns, f"StreamBatchOperator {self.task_id}"),  # rendered
                        data_context={**self.hook.network_settings, **self.data_context})  # network extra, then ours

    def _epoch_manifest(self, context: Context) -> EpochManifest:
        self._manifest_uri = None  # the record's, unless the sensor wrote the manifest somewhere
        if isinstance(self.manifest, str):
            self.manifest = json.loads(self.manifest)
        if self.manifest:
            manifest, self._manifest_uri = manifest_from_xcom(self.manifest)
            return manifest
        if not self.input_path:
            raise ValueError(f"{self.task_id}: give manifest= (e.g. EpochSensor(...).output) or input_path=")
        start, end = epoch_interval(context)
        previous = None if self.full_recompute else EpochCheckpoint(self._output.record_dir(start, end)).load()
        if previous is not None:  # frozen by an earlier try: retries see the same inputs
            return EpochManifest.from_dict(previous.epoch)
        return EpochManifest(start, end, list_inputs(self.input_path)).split(self.max_partition_bytes)

    # -- progress: the task state store mirrors the commit records ----------------------
    @staticmethod
    def progress_summary(record: EpochRecord, manifest_uri: str | None = None) -> dict:
        """What the Task State Store keeps: the bounded epoch summary without tracebacks (counts, the first
        failed partitions with their errors cut short, pointers), whatever the epoch's size."""
        return epoch_summary(record, manifest_uri=manifest_uri, tracebacks=False)

    def _save_progress(self, store, record: EpochRecord) -> None:
        if store is None:
            return
        store.set(STATE_KEY, self.progress_summary(record, getattr(self, "_manifest_uri", None)))
