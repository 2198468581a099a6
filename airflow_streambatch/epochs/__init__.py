"""Epochs: an Airflow data interval's frozen inputs (the manifest) and the frontier
that says when they can no longer change. Pure Python over ``pyarrow.fs``: the
Airflow-facing sensor and operator build on it, and it imports no Airflow."""

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
from airflow_streambatch.epochs.manifest import EpochManifest, InputPartition, list_inputs
from airflow_streambatch.epochs.runner import load_pipeline, read_epoch, run_epoch

__all__ = [
    "FRONTIERS",
    "EpochChangedError",
    "EpochCheckpoint",
    "EpochManifest",
    "EpochRecord",
    "FrontierSpec",
    "InputPartition",
    "MarkerFile",
    "PartitionDirectory",
    "PartitionStatus",
    "Quiescence",
    "Watermark",
    "list_inputs",
    "load_pipeline",
    "make_frontier",
    "read_epoch",
    "run_epoch",
]
