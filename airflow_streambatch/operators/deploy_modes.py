"""Where an epoch's Spark driver runs: in this task's process, or as a spark-submit application.

Each mode checks the pipeline before Spark starts, runs the epoch to its record, and
stops it when the task is killed; the operator picks one by ``deploy_mode``, hands it
the one `epochs.job.EpochJob` it built from its arguments, and does the rest (manifest,
progress, outcome, events) the same way for both.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Callable

from airflow.sdk.exceptions import AirflowException

from airflow_streambatch.engine.spark.connect import active_connect_session, is_connect
from airflow_streambatch.epochs.checkpoint import EpochCheckpoint, EpochRecord, stop_reason
from airflow_streambatch.epochs.job import EpochJob
from airflow_streambatch.epochs.manifest import EpochManifest
from airflow_streambatch.epochs.pipeline_ref import find_pipeline_module
from airflow_streambatch.epochs.runner import load_pipeline, run_job
from airflow_streambatch.epochs.states import EpochState
from airflow_streambatch.operators.links import SparkUILink

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_streambatch.operators.streambatch import StreamBatchOperator

OnProgress = Callable[[EpochRecord], None]


class InProcess:
    """The Spark driver, and the engine's scheduler, in this task's process."""

    def __init__(self, task: StreamBatchOperator):
        self.task = task

    def run(self, context: Context, job: EpochJob, on_progress: OnProgress) -> EpochRecord:
        task = self.task
        load_pipeline(job.pipeline)  # an import error fails here, before Spark starts
        spark = task.hook.get_spark_session()
        # a Spark Connect client does not know the server's UI
        ui, app_id = (None, None) if is_connect(spark) else (spark.sparkContext.uiWebUrl,
                                                             spark.sparkContext.applicationId)
        SparkUILink.persist(context, url=ui, app_id=app_id,  # url None: UI disabled
                            history_server_url=task.hook.history_server_url)
        return run_job(job, on_progress=on_progress, spark_ui_url=ui)

    def stop(self) -> None:
        """Cancel the epoch's Spark jobs; the engine, interrupted, cleans up and records why."""
        from pyspark import SparkContext

        connect = active_connect_session()
        if connect is not None:
            connect.interruptAll()
        sc = SparkContext._active_spark_context
        if sc is not None:
            sc.cancelAllJobs()


class SparkSubmit:
    """The driver in a spark-submit application (`epochs.spark_app`), given the epoch as a spec file."""

    def __init__(self, task: StreamBatchOperator):
        self.task = task

    def run(self, context: Context, job: EpochJob, on_progress: OnProgress) -> EpochRecord:
        task, manifest = self.task, job.manifest
        find_pipeline_module(job.pipeline)  # spark-submit's driver imports it: fail here, before it starts
        # the driver gets the job as its spec, the pipeline as it can load it (`_driver_pipeline`)
        spec = dataclasses.replace(job, pipeline=task._driver_pipeline()).to_spec()
        dag_folder = os.path.dirname(os.path.abspath(task.dag.fileloc)) if task.has_dag() else None
        try:
            task.hook.submit_epoch(spec, python_path=[dag_folder] if dag_folder else None)
        except BaseException as exc:  # noqa: BLE001 - a timeout or SIGTERM must not leave "running"
            task.hook.stop_submitted()
            _record_stopped(task._record_dir, manifest, exc)
            raise
        record = EpochCheckpoint(task._record_dir).load()
        if record is None or EpochManifest.from_dict(record.epoch).fingerprint != manifest.fingerprint:
            raise AirflowException(f"spark-submit finished but left no epoch record for this manifest in "
                                   f"{task._record_dir}/_epoch.json; see the spark-submit log above")
        return record

    def stop(self) -> None:
        self.task.hook.stop_submitted()


def _record_stopped(record_dir: str, manifest: EpochManifest, exc: BaseException) -> None:
    """Say in the record why the spark-submit run stopped: its driver knows only that it got SIGTERM, or
    could not record anything (killed, or stopped before its run began)."""
    checkpoint = EpochCheckpoint(record_dir)
    record = checkpoint.load()
    if record is None or EpochManifest.from_dict(record.epoch).fingerprint != manifest.fingerprint:
        return
    if record.status == EpochState.RUNNING or (record.reason or "").startswith("interrupted: terminated"):
        driver = record.reason if record.status == EpochState.FAILED else "did not record its end"
        record.status, record.reason = EpochState.FAILED, f"{stop_reason(exc)}; the spark-submit driver: {driver}"
        checkpoint.save(record)


DEPLOY_MODES = {"in_process": InProcess, "spark_submit": SparkSubmit}
