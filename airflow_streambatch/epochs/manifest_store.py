"""Durable epoch manifests and the small pointers to them that travel through XCom.

A manifest of 20,000 files is 2.4 MB of JSON: too much for XCom, which lives in
Airflow's metadata database and is read by the scheduler, the UI and every task
that pulls it. So the sensor writes the manifest to durable storage once and pushes
a pointer: `manifest_pointer` (the interval, the fingerprint, counts, and the
manifest's URI), a few hundred bytes whatever the epoch's size. The operator turns
either form back into the manifest with `manifest_from_xcom`: a pointer is read and
checked against its fingerprint, and a whole manifest dict (pushed by sensors of
earlier versions, or by a sensor with nowhere to write a small one) is still accepted.

Where the manifest goes is never the input directory: a sensor may lack the right to
write there (read-only or shared inputs), and an epoch's inputs are not the place for
another system's files. The sensor's `manifest_dir`, the ``[streambatch] manifest_dir``
option, or ``<output>/_manifests`` beside the epoch's output (`manifest_dir_beside`)
hold it; with none of those, XCom carries it whole only up to `MAX_WHOLE_MANIFEST_BYTES`,
and `whole_for_xcom` refuses a bigger one, naming those settings.

The file's name holds the fingerprint and the interval, so writing the same epoch
again writes the same name with the same content (a retried sensor is idempotent),
and a pointer never silently leads to another epoch's inputs.
"""

from __future__ import annotations

import hashlib
import json
import uuid

from airflow_streambatch.engine.filesystems import resolve
from airflow_streambatch.epochs.checkpoint import as_uri
from airflow_streambatch.epochs.manifest import EpochManifest

DEFAULT_SUBDIR = "_manifests"  # under the output directory: `_`-prefixed, so listings and readers skip it
POINTER_KEY = "manifest_uri"
# The most JSON a whole manifest may put in XCom or a trigger event (both live in Airflow's
# metadata database, read by the scheduler, the UI and every task that pulls them): about
# 500 partitions. A 20,000-partition manifest is 2.4 MB.
MAX_WHOLE_MANIFEST_BYTES = 64 * 1024
LOCATION_SETTINGS = ("EpochSensor(manifest_dir=...), the [streambatch] manifest_dir option "
                     "(AIRFLOW__STREAMBATCH__MANIFEST_DIR), or EpochSensor(output_path=...)")


class ManifestTooLargeError(ValueError):
    """A manifest with nowhere to be written is too large to travel whole."""


def manifest_dir_beside(output_path: str) -> str:
    """``<output_path>/_manifests``: beside the partitions and the epoch record of the output.

    The output's commit and lease code leave ``_``-prefixed entries alone (never taken
    for foreign output, never deleted by an overwrite), and every reader of this provider
    (and Spark, pyarrow, pandas, Delta) skips them, so the manifests never become rows.
    """
    return f"{output_path.rstrip('/')}/{DEFAULT_SUBDIR}"


def whole_manifest(manifest: EpochManifest, task: str) -> dict:
    """The manifest as the dict that travels whole, when it is small enough to; else
    `ManifestTooLargeError` naming where it could be written instead. ``task``: who asks."""
    whole = manifest.to_dict()
    size = len(json.dumps(whole, separators=(",", ":")))
    if size > MAX_WHOLE_MANIFEST_BYTES:
        raise ManifestTooLargeError(
            f"{task}: the epoch manifest ({len(manifest.partitions)} partitions, {size} bytes of JSON) is over "
            f"the {MAX_WHOLE_MANIFEST_BYTES} bytes that may travel whole through XCom, and there is nowhere "
            f"to write it: set {LOCATION_SETTINGS} (the manifest then goes to <output_path>/{DEFAULT_SUBDIR}), "
            "a location the operator can read")
    return whole


def manifest_file_name(manifest: EpochManifest, fingerprint: str | None = None) -> str:
    interval = hashlib.sha256(f"{manifest.interval_start}..{manifest.interval_end}".encode()).hexdigest()[:8]
    return f"manifest-{fingerprint or manifest.fingerprint}-{interval}.json"


def write_manifest(manifest: EpochManifest, directory: str, fingerprint: str | None = None) -> str:
    """Write ``manifest`` under ``directory`` through a temporary name; its URI. ``fingerprint``: the
    manifest's, if already known (it costs a pass over every partition)."""
    fs, inner = resolve(directory.rstrip("/"))
    fs.create_dir(inner, recursive=True)
    name = manifest_file_name(manifest, fingerprint)
    path = f"{inner}/{name}"
    tmp = f"{inner}/_{name}.{uuid.uuid4().hex[:8]}.tmp"
    with fs.open_output_stream(tmp) as out:
        out.write(json.dumps(manifest.to_dict(), separators=(",", ":")).encode())
    fs.move(tmp, path)
    return as_uri(f"{directory.rstrip('/')}/{name}")


def manifest_pointer(manifest: EpochManifest, uri: str, fingerprint: str | None = None) -> dict:
    """What the sensor pushes to XCom: bounded whatever the number of partitions.

    ``partitions`` is a count here (a list in a whole manifest), so code that takes
    the pointer for a manifest fails loudly instead of seeing an empty epoch.
    """
    return {
        "interval_start": manifest.interval_start, "interval_end": manifest.interval_end,
        "fingerprint": fingerprint or manifest.fingerprint, POINTER_KEY: uri,
        "partitions": len(manifest.partitions), "files": len(manifest.files), "bytes": manifest.total_bytes,
    }


def freeze(manifest: EpochManifest, directory: str) -> dict:
    """Write the manifest under ``directory`` and return its pointer (the fingerprint computed once)."""
    fingerprint = manifest.fingerprint
    return manifest_pointer(manifest, write_manifest(manifest, directory, fingerprint), fingerprint)


def read_manifest(uri: str, fingerprint: str | None = None) -> EpochManifest:
    """The manifest at ``uri``: a manifest file, or an epoch record (``_epoch.json``, whose ``epoch`` it is).

    Raises FileNotFoundError when it is gone, and ValueError when its fingerprint is
    not ``fingerprint`` (the file was replaced since the pointer was made).
    """
    fs, inner = resolve(uri)
    try:
        with fs.open_input_stream(inner) as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        raise FileNotFoundError(f"the epoch manifest {uri} that XCom points to does not exist (deleted since "
                                "the sensor wrote it?): rerun the sensor to freeze the epoch again") from None
    if "epoch" in data:  # an epoch record (RECORD_NAME) holds its manifest under "epoch"
        data = data["epoch"]
    manifest = EpochManifest.from_dict(data)
    if fingerprint is not None and manifest.fingerprint != fingerprint:
        raise ValueError(f"the epoch manifest {uri} has fingerprint {manifest.fingerprint}, but the pointer in "
                         f"XCom says {fingerprint}: the file was replaced since the sensor froze the epoch; "
                         "rerun the sensor")
    return manifest


def manifest_from_xcom(value: dict | str) -> tuple[EpochManifest, str | None]:
    """(the manifest, its URI or None) from what a sensor pushed: a pointer, a whole manifest, or their JSON."""
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise TypeError(f"an epoch manifest must be a dict (EpochSensor's XCom), got {type(value).__name__}")
    if POINTER_KEY in value:
        return read_manifest(value[POINTER_KEY], value.get("fingerprint")), value[POINTER_KEY]
    if not isinstance(value.get("partitions"), list):
        raise ValueError(f"an epoch manifest needs a {POINTER_KEY!r} or a 'partitions' list; got keys "
                         f"{sorted(value)}")
    return EpochManifest.from_dict(value), None
