"""Epochs: an Airflow data interval's frozen inputs (the manifest) and the frontier
that says when they can no longer change. Pure Python over ``pyarrow.fs``: the
Airflow-facing sensor and operator build on it, and it imports no Airflow."""

from airflow_streambatch.epochs.frontier import MarkerFile, Quiescence, Watermark
from airflow_streambatch.epochs.manifest import EpochManifest, InputPartition, list_inputs

__all__ = [
    "EpochManifest",
    "InputPartition",
    "MarkerFile",
    "Quiescence",
    "Watermark",
    "list_inputs",
]
