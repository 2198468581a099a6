"""Where an epoch's rows go: a directory of files, or a Delta or Iceberg table.

Why one object: the runner, the spark-submit application and the operator all need
the same three answers: how to write the epoch (``write_*`` with ``mode="resume"``),
which of its partitions are committed already, and where its durable epoch record and
write lease live. For a directory that is the directory itself (``_epoch.json`` beside
``p<partition>/``). A table is shared by every epoch, so each epoch's record and lease
live in ``<table location>/_streambatch/epochs/<interval>/`` (table readers skip
``_``-prefixed paths), and its partitions are committed under the epoch as idempotence
key: a retry or Clear of one epoch never commits a partition twice, and epochs written
at once commit side by side through the table's optimistic concurrency.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

from airflow_streambatch.engine.dataset import Dataset
from airflow_streambatch.engine.execution.partitions import WriteResult
from airflow_streambatch.engine.output.commit import CommitRecord, PartitionCommitter
from airflow_streambatch.engine.output.target import OutputTarget
from airflow_streambatch.epochs.manifest import EpochManifest

FILE_FORMATS = ("parquet", "json", "csv")
TABLE_FORMATS = ("delta", "iceberg")
OUTPUT_FORMATS = FILE_FORMATS + TABLE_FORMATS


@dataclass(frozen=True)
class EpochOutput:
    """:param path: the output directory (files), the Delta table's URI, or the Iceberg table's
        identifier (``db.table``).
    :param format: one of `OUTPUT_FORMATS`.
    :param options: keyword arguments of the write: ``write_parquet(compression=...)``,
        ``write_delta(storage_options=...)``, ``write_iceberg(catalog_kwargs=..., snapshot_properties=...)``.
    """

    path: str
    format: str = "parquet"
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.format not in OUTPUT_FORMATS:
            raise ValueError(f"output_format={self.format!r} is not one of {list(OUTPUT_FORMATS)}")

    @property
    def is_table(self) -> bool:
        return self.format in TABLE_FORMATS

    def location(self) -> str:
        """The directory the rows land under (a table's location), for overlap checks and links."""
        return self._table.uri if self.is_table else self.path

    def record_dir(self, interval_start: str, interval_end: str) -> str:
        """Where the record (``_epoch.json``) and write lease of the epoch with this interval live."""
        if not self.is_table:
            return self.path
        interval = re.sub(r"[^0-9A-Za-z.+-]+", "_", f"{interval_start}--{interval_end}")
        return f"{self.location().rstrip('/')}/_streambatch/epochs/{interval}"

    def describe(self) -> str:
        """``delta table s3://...`` or ``iceberg table db.scores``; a directory is its path."""
        return f"{self.format} table {self.path}" if self.is_table else self.path

    def committed(self, target: OutputTarget, manifest: EpochManifest) -> dict[int, CommitRecord]:
        if not self.is_table:
            return PartitionCommitter(self.path, run_id="inspect", lease=target.lease).committed()
        return self._table.markers(epoch_key(manifest))

    def write(self, ds: Dataset, target: OutputTarget, manifest: EpochManifest, on_commit) -> WriteResult:
        """``mode="resume"``: the commits (records, or a table's markers) decide what is left."""
        write = getattr(ds, f"write_{self.format}")
        if not self.is_table:
            return write(target, mode="resume", on_commit=on_commit, **self.options)
        return write(self.path, mode="resume", idempotence_key=epoch_key(manifest), on_commit=on_commit,
                     **self.options)

    @cached_property
    def _table(self):
        """The table's format object, built once: an Iceberg one loads its catalog and table."""
        if self.format == "delta":
            from airflow_streambatch.engine.output.delta import DeltaFormat

            return DeltaFormat(self.path, self.options.get("storage_options"))
        from airflow_streambatch.engine.output.iceberg import IcebergFormat

        return IcebergFormat(self.path, self.options.get("catalog_kwargs"), self.options.get("snapshot_properties"))


def epoch_key(manifest: EpochManifest) -> str:
    """The idempotence key of an epoch's partitions in a table: its interval."""
    return f"{manifest.interval_start}/{manifest.interval_end}"
