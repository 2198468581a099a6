"""Epochs: an Airflow data interval's frozen inputs (the manifest) and the frontier
that says when they can no longer change; one run of an epoch as a job (`EpochJob`,
what the operator hands to either deploy mode) and a try of it (`EpochRun`, its durable
record), with its states (`EpochState`, `PartitionState`). Pure Python over ``pyarrow.fs``
and the engine: the Airflow-facing sensor and operator build on it, and it imports no Airflow."""

from airflow_streambatch.epochs.checkpoint import EpochChangedError, EpochCheckpoint, EpochRecord, PartitionStatus
from airflow_streambatch.epochs.frontier import (
    FRONTIERS,
    FrontierSpec,
    MarkerFile,
    PartitionDirectory,
    Quiescence,
    Watermark,
    make_frontier,
)
from airflow_streambatch.epochs.epoch_run import EpochRun
from airflow_streambatch.epochs.job import EpochJob
from airflow_streambatch.epochs.manifest import EpochManifest, InputPartition, list_inputs
from airflow_streambatch.epochs.runner import load_pipeline, read_epoch, run_epoch, run_job
from airflow_streambatch.epochs.states import EpochState, PartitionState

__all__ = [
    "FRONTIERS",
    "EpochChangedError",
    "EpochCheckpoint",
    "EpochJob",
    "EpochManifest",
    "EpochRecord",
    "EpochRun",
    "EpochState",
    "FrontierSpec",
    "InputPartition",
    "MarkerFile",
    "PartitionDirectory",
    "PartitionState",
    "PartitionStatus",
    "Quiescence",
    "Watermark",
    "list_inputs",
    "load_pipeline",
    "make_frontier",
    "read_epoch",
    "run_epoch",
    "run_job",
]
