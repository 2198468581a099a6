"""EpochSensor: wait until an epoch's inputs can no longer change, then freeze them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.epochs.frontier import FrontierSpec
from airflow_streambatch.epochs.manifest import DEFAULT_MAX_PARTITION_BYTES, EpochManifest
from airflow_streambatch.epochs.manifest_store import manifest_from_xcom
from airflow_streambatch.epochs.sensing import check_epoch, epoch_interval
from airflow_streambatch.hooks.object_store import connection_credentials
from airflow_streambatch.operators.lineage import EpochSensorLineageMixin
from airflow_streambatch.sensors.manifest_location import ManifestLocation, manifest_location, publish
from airflow_streambatch.triggers.epoch import EpochTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

STATE_KEY = "epoch_frontier_state"  # quiescence's listing and quiet-since time, kept between pokes


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


INTERVAL_TIMETABLES = ('CronDataIntervalTimetable("0 * * * *", timezone=...) or '
                       'CronTriggerTimetable("0 * * * *", timezone=..., interval=timedelta(hours=1)) '
                       '(both in airflow.sdk)')


def zero_length_interval_message(context: Context, task_id: str, frontier: str) -> str | None:
    """Why an empty data interval is a problem for this sensor, or None when the run has a real interval.

    Airflow 3 turns ``schedule="@hourly"`` (and any cron string) into a `CronTriggerTimetable`
    whose runs are instants: data_interval_start == data_interval_end == the run's time,
    so the period a run should process is not what Airflow calls its interval.
    """
    start, end = epoch_interval(context)
    if start != end:
        return None
    dag = context.get("dag")
    timetable = type(getattr(dag, "timetable", None)).__name__ if dag is not None else "unknown"
    return (f"EpochSensor {task_id} (frontier={frontier!r}): the run's data interval {start}..{end} has zero length "
            f"(the DAG's timetable is {timetable}; a cron schedule string such as '@hourly' gives each run a single "
            "instant in Airflow 3), so the epoch covers no period. Schedule the DAG with "
            f"{INTERVAL_TIMETABLES}, so that each run's interval is the period that just ended, and build paths "
            "from it, e.g. {{ data_interval_start.strftime('%Y-%m-%d/%H') }}.")


class EpochSensor(EpochSensorLineageMixin, BaseSensorOperator):
    """Waits until the input frontier has passed the data interval's end; freezes the epoch manifest.

    The manifest (every input partition with path, size and mtime, plus the interval)
    is the lineage root of the epoch. It is written to durable storage, never under the
    input (`manifest_location`: ``manifest_dir``, else ``[streambatch] manifest_dir``, else
    beside ``output_path``), and this task's XCom ``return_value`` is a pointer to it:
    interval, fingerprint, counts and ``manifest_uri``, a few hundred bytes however many
    files the epoch has (a 20,000-file manifest is 2.4 MB). With no location, XCom carries
    a manifest of up to 64 KiB whole and a bigger one fails the task. Pass ``sensor.output``
    to `StreamBatchOperator(manifest=...)`, which reads the manifest back and checks its
    fingerprint.

    :param input_path: the epoch's input directory or glob, e.g. ``/data/in/{{ ds }}`` (templated).
    :param frontier: how completeness shows: ``marker`` (a file such as ``_SUCCESS``),
        ``watermark`` (a file holding an ISO-8601 time at or past the interval end),
        ``directory`` (the partition directory exists with files), or ``quiescence``
        (the listing stayed unchanged for ``quiet_period``).
    :param marker_path: the marker file (templated); default ``<input_path>/_SUCCESS``.
    :param watermark_path: the watermark file (templated), for ``frontier="watermark"``. The watermark
        frontier needs a run with a real data interval (e.g. ``CronDataIntervalTimetable``): it refuses
        a zero-length one, such as ``schedule="@hourly"`` gives; the other frontiers warn.
    :param quiet_period: seconds (or a timedelta) without change, for ``frontier="quiescence"``.
    :param deferrable: wait in the triggerer (`EpochTrigger`) instead of holding a worker slot; default
        ``[operators] default_deferrable`` (False unless set), as for Airflow's own deferrable sensors.
    :param max_partition_bytes: a file larger than this becomes several partitions of about this many
        bytes (Spark's ``spark.sql.files.maxPartitionBytes``, same 128 MiB default), each its own read
        task, commit and unit of retry: row-group ranges of a Parquet file, byte ranges of the lines
        of a ``.csv``, ``.tsv``, ``.json``/``.jsonl``/``.ndjson`` (JSON Lines), ``.txt``, ``.text`` or
        ``.log`` file; ``None`` keeps files whole.
    :param manifest_dir: where the frozen manifest is written (templated; any path the operator's
        workers can read), as ``manifest-<fingerprint>-<interval hash>.json``. Default: the
        ``[streambatch] manifest_dir`` option, else ``<output_path>/_manifests``, else none (XCom
        carries a manifest of up to 64 KiB whole; a bigger one fails the task naming this setting).
        Never the input. A location that cannot be written fails the task naming its setting.
    :param output_path: the output directory (or Delta table URI) the epoch is processed into, the
        operator's ``output_path`` (templated): the manifest goes to ``<output_path>/_manifests``
        (``_``-prefixed: the output's commits and readers skip it) unless ``manifest_dir`` or the
        option says otherwise. Not an Iceberg identifier: give ``manifest_dir`` for those.
    :param storage_conn_id: the Airflow connection whose credentials list the input, read the marker or
        watermark and write the manifest on an object store (``s3://``, ``gs://``, Azure), as
        `StreamBatchOperator`'s ``storage_conn_id``: type ``aws``, ``google_cloud_platform``, ``wasb``,
        ``adls`` or ``azure_data_lake``, or a Spark connection with a ``storage`` extra. They are set in
        the task's process while it pokes (deferred: in the triggerer's, for each poll), never on a
        command line, and masked in logs. None: the processes' own environment.
    """

    template_fields: Sequence[str] = ("input_path", "marker_path", "watermark_path", "manifest_dir", "output_path")
    ui_color = "#e8f4ea"

    def __init__(self, *, input_path: str, frontier: str = "marker", marker_path: str | None = None,
                 watermark_path: str | None = None, quiet_period: float | timedelta = 300.0,
                 deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
                 max_partition_bytes: int | None = DEFAULT_MAX_PARTITION_BYTES,
                 manifest_dir: str | None = None, output_path: str | None = None,
                 storage_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # the arguments stay attributes: template_fields renders them in place before execute
        self.input_path = input_path
        self.frontier = frontier
        self.marker_path = marker_path
        self.watermark_path = watermark_path
        self.quiet_period_s = _seconds(quiet_period)
        self.deferrable = deferrable
        check_positive_int(max_partition_bytes, f"EpochSensor {self.task_id}: max_partition_bytes", allow_none=True)
        self.max_partition_bytes = max_partition_bytes
        self.manifest_dir = manifest_dir
        self.output_path = output_path
        self.storage_conn_id = storage_conn_id
        self._state: dict | None = None
        try:
            self.frontier_spec  # noqa: B018 - checked when the DAG is parsed, not at the first poke
        except ValueError as exc:
            raise ValueError(f"EpochSensor {self.task_id}: {exc}") from None

    @property
    def frontier_spec(self) -> FrontierSpec:
        """The frontier this sensor waits for, from its arguments as they are now (rendered, in execute)."""
        return FrontierSpec(self.frontier, self.input_path, self.marker_path, self.watermark_path,
                            self.quiet_period_s)

    def poke(self, context: Context) -> PokeReturnValue:
        # reschedule mode pokes from a new process each time: keep quiescence's state in the task state store
        store = context.get("task_state_store")
        state = store.get(STATE_KEY) if store is not None else self._state
        start, end = epoch_interval(context)
        manifest, state = check_epoch(self.frontier_spec.build(), self.input_path, start, end, state, time.time())
        self._state = state
        if store is not None and state is not None:
            store.set(STATE_KEY, state)
        if manifest is None:
            self.log.info("Epoch %s..%s: %s frontier not passed yet under %s", start, end, self.frontier,
                          self.input_path)
            return PokeReturnValue(is_done=False)
        manifest = manifest.split(self.max_partition_bytes)  # large files as row-group or byte ranges
        self.log.info("Epoch %s..%s passed its %s frontier: %d input file(s), %d bytes, %d partition(s)",
                      start, end, self.frontier, len(manifest.files), manifest.total_bytes, len(manifest.partitions))
        return PokeReturnValue(is_done=True, xcom_value=self._publish(manifest))

    def _manifest_location(self) -> ManifestLocation:
        """Where the manifest goes, from the rendered arguments and the configuration (never the input)."""
        return manifest_location(f"EpochSensor {self.task_id}", self.manifest_dir, self.output_path)

    def _publish(self, manifest: EpochManifest) -> dict:
        """Write the manifest where `manifest_location` says and return the pointer that goes to XCom
        (no location: the manifest itself, if small)."""
        location = self._manifest_location()
        value = publish(manifest, location, f"EpochSensor {self.task_id}")
        self._lineage_manifest, self._lineage_manifest_uri = manifest, value.get("manifest_uri")  # OpenLineage
        if location.directory is None:
            self.log.info("Epoch manifest %s (%d partitions) goes to XCom whole: no manifest_dir, [streambatch] "
                          "manifest_dir or output_path is set", manifest.fingerprint, len(manifest.partitions))
        else:
            self.log.info("Epoch manifest %s (%d partitions) written to %s", value["fingerprint"],
                          len(manifest.partitions), value["manifest_uri"])
        return value

    def execute(self, context: Context) -> Any:
        # every poke reads the store (in reschedule mode each try is a new process, entering here again)
        with connection_credentials(self.storage_conn_id, self.log):
            return self._execute(context)

    def _execute(self, context: Context) -> Any:
        problem = zero_length_interval_message(context, self.task_id, self.frontier)
        if problem is not None and self.frontier == "watermark":  # "at or past the end" of an instant: meaningless
            raise AirflowFailException(problem)
        if problem is not None:
            self.log.warning("%s The %s frontier still works, but the epoch is then whatever the inputs hold.",
                             problem, self.frontier)
        if not self.deferrable:
            return super().execute(context)
        first = self.poke(context)
        if first.is_done:
            return first.xcom_value
        start, end = epoch_interval(context)
        self.defer(
            trigger=EpochTrigger.for_spec(self.frontier_spec, interval_start=start, interval_end=end,
                                          poll_interval=_seconds(self.poke_interval), state=self._state,
                                          manifest_dir=self._manifest_location().directory,
                                          storage_conn_id=self.storage_conn_id),
            method_name="execute_complete",
            timeout=timedelta(seconds=_seconds(self.timeout)) if self.timeout else None,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict:
        if event.get("status") != "passed":
            raise AirflowException(f"EpochSensor {self.task_id} on {self.input_path}: {event.get('message')}")
        with connection_credentials(self.storage_conn_id, self.log):  # the trigger's manifest is on the store
            manifest, _ = manifest_from_xcom(event.get("manifest_pointer") or event["manifest"])
            self.log.info("Epoch %s..%s passed its %s frontier: %d input file(s)", manifest.interval_start,
                          manifest.interval_end, self.frontier, len(manifest.partitions))
            return self._publish(manifest.split(self.max_partition_bytes))
