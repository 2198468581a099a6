"""OpenLineage for epochs: what an epoch read, what it wrote, and what became of each partition.

The OpenLineage provider's listener calls ``get_openlineage_facets_on_start``,
``_on_complete`` and ``_on_failure`` on the task object that ran (the same instance,
after ``execute``), so the operator hands over what it already holds in memory: the
frozen manifest (the lineage roots), the output location and the epoch record. No
I/O happens here; an object store's credentials are gone by the time the listener
runs. Nothing here runs unless the ``apache-airflow-providers-openlineage`` package is
installed and enabled: the listener is the only caller, and the imports are inside.

Events stay bounded for epochs of any size: at most `MAX_INPUT_DATASETS` input files
(beyond that, their distinct directories), and the ``streambatch_epoch`` run facet
carries counts for every partition plus the first `MAX_PARTITIONS_SHOWN` entries,
failed and unfinished ones first, as `epochs.summary` bounds the XCom.
"""

from __future__ import annotations

import posixpath
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from airflow_streambatch.epochs.checkpoint import as_uri, record_uri
from airflow_streambatch.epochs.states import PartitionState
from airflow_streambatch.epochs.summary import ERROR_CHARS, PATH_CHARS, _head, _tail

if TYPE_CHECKING:
    from airflow_streambatch.epochs.checkpoint import EpochRecord
    from airflow_streambatch.epochs.manifest import EpochManifest

FACET_NAME = "streambatch_epoch"  # the run facet's key in every event of the operator and the sensor
MAX_INPUT_DATASETS = 1000  # input files named one by one; more become their directories
MAX_PARTITIONS_SHOWN = 100  # partitions listed in the run facet; the rest are counted
_BUCKET_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "abfs": "abfs", "abfss": "abfss",
                   "wasb": "wasbs", "wasbs": "wasbs", "az": "abfs"}


def dataset_name(location: str) -> tuple[str, str]:
    """OpenLineage's (namespace, name) of a path or URI (its naming spec): ``s3://bucket/key`` is
    (``s3://bucket``, ``key``), a local path or ``file:///p`` is (``file``, ``/p``), HDFS
    (``hdfs://host:port``, ``/p``). Spark's OpenLineage integration names them the same way, so the
    Spark application's own events and these join in a lineage graph."""
    uri = as_uri(location)
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("", "file"):
        return "file", posixpath.normpath(parsed.path or location)
    if scheme in _BUCKET_SCHEMES:
        return f"{_BUCKET_SCHEMES[scheme]}://{parsed.netloc}", parsed.path.lstrip("/").rstrip("/")
    return f"{scheme}://{parsed.netloc}", parsed.path or "/"


def _dataset(cls, location: str, **facets):
    namespace, name = dataset_name(location)
    return cls(namespace=namespace, name=name, facets=facets or {})


def input_datasets(manifest: EpochManifest) -> list:
    """The manifest's files (a file split into ranges once), or their directories for a huge epoch."""
    from airflow.providers.common.compat.openlineage.facet import InputDataset

    files = manifest.files
    if len(files) > MAX_INPUT_DATASETS:
        files = list(dict.fromkeys(posixpath.dirname(f.rstrip("/")) for f in files))[:MAX_INPUT_DATASETS]
    return [_dataset(InputDataset, f) for f in files]


def output_dataset(location: str, record: EpochRecord | None = None):
    """The output directory or table, with what this try wrote to it (rows, bytes, files of the partitions
    it committed; partitions committed by earlier tries were counted in their own tries' events)."""
    from airflow.providers.common.compat.openlineage.facet import OutputDataset, OutputStatisticsOutputDatasetFacet

    if record is None:
        return _dataset(OutputDataset, location)
    written = [p for p in record.partitions if p.state == PartitionState.COMMITTED and p.this_try]
    stats = OutputStatisticsOutputDatasetFacet(rowCount=sum(p.rows for p in written),
                                               size=sum(p.bytes for p in written),
                                               fileCount=sum(len(p.files) for p in written))
    namespace, name = dataset_name(location)
    return OutputDataset(namespace=namespace, name=name, outputFacets={"outputStatistics": stats})


@cache
def _epoch_facet_class():
    """The ``streambatch_epoch`` run facet (built on first use: the OpenLineage client is optional)."""
    import attr
    from airflow.providers.common.compat.openlineage.facet import RunFacet

    @attr.define
    class StreamBatchEpochRunFacet(RunFacet):
        """An epoch of airflow-streambatch: its interval and manifest, and each partition's state."""

        interval_start: str
        interval_end: str
        fingerprint: str
        partitions: int
        manifest_uri: str | None = None
        record_uri: str | None = None
        status: str | None = None  # the epoch's: running, succeeded, failed
        try_number: int | None = None  # runs of this epoch on this output so far; this event's is the last
        counts: dict[str, int] = attr.field(factory=dict)  # committed, committed_this_try, failed, pending
        partition_states: list[dict[str, Any]] = attr.field(factory=list)
        partitions_left_out: int = 0

        @staticmethod
        def _get_schema() -> str:
            return "https://github.com/airflow-streambatch/airflow-streambatch/blob/main/docs/airflow.md#openlineage"

    return StreamBatchEpochRunFacet


def _partition_entry(p, tries: int) -> dict:
    entry = {"index": p.index, "path": _tail(p.path, PATH_CHARS), "state": str(p.state)}  # the facet's JSON
    if p.state == PartitionState.COMMITTED:  # which try committed it: this one (the record's last), or an earlier one
        entry.update(committed_by_this_try=p.this_try, committing_try=tries if p.this_try else None,
                     run_id=p.run_id, rows=p.rows)
    elif p.state == PartitionState.FAILED:
        entry.update(operator=p.operator, error=_head(p.error, ERROR_CHARS))
    return entry


def epoch_facet(manifest: EpochManifest, *, record: EpochRecord | None = None, manifest_uri: str | None = None):
    """The run facet: the epoch's identity, and with a record each partition's state (bounded)."""
    cls = _epoch_facet_class()
    if record is None:
        return cls(interval_start=manifest.interval_start, interval_end=manifest.interval_end,
                   fingerprint=manifest.fingerprint, partitions=len(manifest.partitions), manifest_uri=manifest_uri)
    counts = record.counts()
    unfinished = [p for p in record.partitions if p.state != PartitionState.COMMITTED]
    shown = (unfinished + [p for p in record.partitions if p.state == PartitionState.COMMITTED])[:MAX_PARTITIONS_SHOWN]
    return cls(interval_start=record.epoch["interval_start"], interval_end=record.epoch["interval_end"],
               fingerprint=record.fingerprint, partitions=len(record.partitions),
               manifest_uri=manifest_uri or record_uri(record.output_path), record_uri=record_uri(record.output_path),
               status=str(record.status), try_number=record.tries,
               counts={k: counts[k] for k in ("committed", "committed_this_try", "failed", "pending")},
               partition_states=[_partition_entry(p, record.tries) for p in sorted(shown, key=lambda p: p.index)],
               partitions_left_out=len(record.partitions) - len(shown))


def _lineage(inputs=(), outputs=(), run_facets=None):
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(inputs=list(inputs), outputs=list(outputs), run_facets=run_facets or {})


class StreamBatchLineageMixin:
    """OpenLineage facets of `StreamBatchOperator`. ``execute`` leaves ``_lineage_manifest`` (the frozen
    manifest, once known) and ``_epoch_record`` (the epoch record the try ended with) on the task."""

    _lineage_manifest: EpochManifest | None = None
    _epoch_record: EpochRecord | None = None

    def _lineage_output_location(self) -> str:
        output = self._output
        return output.location() if output.is_table else output.path

    def get_openlineage_facets_on_start(self):
        """Before ``execute``: the output (templates are rendered by now); the inputs only when the manifest
        came whole (the sensor's pointer names a file this process has not read yet)."""
        from airflow_streambatch.epochs.manifest import EpochManifest

        self._lineage_manifest = self._epoch_record = None  # a task object that ran before (dag.test())
        manifest = self.manifest
        inline = isinstance(manifest, dict) and "partitions" in manifest and isinstance(manifest["partitions"], list)
        inputs = input_datasets(EpochManifest.from_dict(manifest)) if inline else []
        return _lineage(inputs, [_dataset_output(self)])

    def get_openlineage_facets_on_complete(self, task_instance=None):
        return self._epoch_lineage()

    def get_openlineage_facets_on_failure(self, task_instance=None):
        """A failed try still read its inputs and committed some partitions: say which, and which failed."""
        return self._epoch_lineage()

    def _epoch_lineage(self):
        manifest, record = self._lineage_manifest, self._epoch_record
        if manifest is None:  # failed before the manifest was read: only where the rows would have gone
            return _lineage(outputs=[_dataset_output(self)])
        manifest_uri = getattr(self, "_manifest_uri", None)
        return _lineage(input_datasets(manifest), [output_dataset(self._lineage_output_location(), record)],
                        {FACET_NAME: epoch_facet(manifest, record=record, manifest_uri=manifest_uri)})


def _dataset_output(task: StreamBatchLineageMixin):
    return output_dataset(task._lineage_output_location())


class EpochSensorLineageMixin:
    """OpenLineage facets of `EpochSensor`: it reads the listing of ``input_path`` and freezes the epoch's
    inputs; ``_publish`` leaves the manifest (``_lineage_manifest``) and where it wrote it."""

    _lineage_manifest: EpochManifest | None = None
    _lineage_manifest_uri: str | None = None

    def get_openlineage_facets_on_start(self):
        from airflow.providers.common.compat.openlineage.facet import InputDataset

        return _lineage([_dataset(InputDataset, self.input_path)])

    def get_openlineage_facets_on_complete(self, task_instance=None):
        if self._lineage_manifest is None:
            return self.get_openlineage_facets_on_start()
        return _lineage(input_datasets(self._lineage_manifest),
                        run_facets={FACET_NAME: epoch_facet(self._lineage_manifest,
                                                            manifest_uri=self._lineage_manifest_uri)})

    def get_openlineage_facets_on_failure(self, task_instance=None):
        return self.get_openlineage_facets_on_start()
