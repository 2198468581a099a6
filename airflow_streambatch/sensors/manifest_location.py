"""Where `EpochSensor` puts the epoch manifest it freezes: a location someone chose, never the input.

Earlier the sensor wrote ``<input_path>/_manifests`` by default, because the input was
the one path it knew, and pushed the whole manifest to XCom, with only a warning, when
that failed (read-only inputs). Inputs are often another team's bucket, read-only or
shared, and a multi-megabyte XCom weighs on the scheduler and the UI. So the location
is, in order:

1. the sensor's ``manifest_dir=`` argument;
2. the ``[streambatch] manifest_dir`` Airflow option (``AIRFLOW__STREAMBATCH__MANIFEST_DIR``),
   one place for every sensor of a deployment;
3. ``<output_path>/_manifests`` when the sensor is told the output its epoch is for
   (``output_path=``, as the operator's): the pipeline writes there anyway, so the
   location is writable and readable by the operator's workers;
4. nowhere: XCom carries the manifest whole if it is small
   (`manifest_store.MAX_WHOLE_MANIFEST_BYTES`), and a bigger one fails the task naming
   the settings above.

A location given (1 to 3) that cannot be written fails the task naming its setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow.sdk.configuration import conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_streambatch.epochs.manifest import EpochManifest
from airflow_streambatch.epochs.manifest_store import (
    ManifestTooLargeError,
    freeze,
    manifest_dir_beside,
    whole_manifest,
)

CONFIG_SECTION = "streambatch"
CONFIG_OPTION = "manifest_dir"


@dataclass(frozen=True)
class ManifestLocation:
    """``directory``: where the manifest is written (None: nowhere, XCom carries a small one
    whole); ``setting``: the argument or option it comes from, as an error names it."""

    directory: str | None
    setting: str = ""


def manifest_location(task: str, manifest_dir: str | None, output_path: str | None) -> ManifestLocation:
    """The location, from the sensor's rendered ``manifest_dir`` and ``output_path`` and the
    Airflow configuration read now (in the worker that runs the task)."""
    if manifest_dir:
        return ManifestLocation(manifest_dir, f"manifest_dir={manifest_dir!r}")
    configured = (conf.get(CONFIG_SECTION, CONFIG_OPTION, fallback="") or "").strip()
    if configured:
        return ManifestLocation(configured, f"[{CONFIG_SECTION}] {CONFIG_OPTION} = {configured!r} "
                                            f"(AIRFLOW__{CONFIG_SECTION.upper()}__{CONFIG_OPTION.upper()})")
    if output_path:
        if "/" not in output_path:  # "db.table": an Iceberg identifier has no directory to write beside
            raise AirflowFailException(
                f"{task}: output_path={output_path!r} is no directory or URI (an Iceberg table identifier?), so "
                f"the epoch manifest cannot go beside it: set manifest_dir= or the [{CONFIG_SECTION}] "
                f"{CONFIG_OPTION} option to a location the operator can read")
        directory = manifest_dir_beside(output_path)
        return ManifestLocation(directory, f"output_path={output_path!r}, which puts it under {directory}; "
                                           "set manifest_dir= to write elsewhere")
    return ManifestLocation(None)


def publish(manifest: EpochManifest, location: ManifestLocation, task: str) -> dict:
    """Write the manifest at ``location`` and return its pointer, or (no location) the manifest
    itself if it is small; what the sensor pushes to XCom."""
    if location.directory is None:
        try:
            return whole_manifest(manifest, task)
        except ManifestTooLargeError as exc:  # the same epoch is as large on a retry
            raise AirflowFailException(str(exc)) from None
    try:
        return freeze(manifest, location.directory)
    except OSError as exc:
        raise AirflowException(f"{task}: cannot write the epoch manifest under {location.directory} "
                               f"({location.setting}): {exc}") from exc
