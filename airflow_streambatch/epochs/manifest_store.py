"""Durable epoch manifests and the small pointers to them that travel through XCom.

A manifest of 20,000 files is 2.4 MB of JSON: too much for XCom, which lives in
Airflow's metadata database and is read by the scheduler, the UI and every task
that pulls it. So the sensor writes the manifest to durable storage once and pushes
a pointer: `manifest_pointer` (the interval, the fingerprint, counts, and the
manifest's URI), a few hundred bytes whatever the epoch's size. The operator turns
either form back into the manifest with `manifest_from_xcom`: a pointer is read and
checked against its fingerprint, and a whole manifest dict (pushed by sensors of
earlier versions, or by a sensor that could not write) is still accepted.

The file's name holds the fingerprint and the interval, so writing the same epoch
again writes the same name with the same content (a retried sensor is idempotent),
and a pointer never silently leads to another epoch's inputs.
"""

from __future__ import annotations

import hashlib
import json
import uuid

import pyarrow.fs as pafs

from airflow_streambatch.engine.filesystems import resolve
from airflow_streambatch.epochs.checkpoint import as_uri
from airflow_streambatch.epochs.manifest import EpochManifest

DEFAULT_SUBDIR = "_manifests"  # under the input directory: `_`-prefixed, so listings and readers skip it
POINTER_KEY = "manifest_uri"


def default_manifest_dir(input_path: str) -> str:
    """``<input directory>/_manifests``: the one place a sensor that knows only its input can write.

    Every reader of this provider (and Spark, pyarrow, pandas) skips ``_``-prefixed
    paths, so the manifests never become inputs of the epoch they describe.
    """
    fs, inner = resolve(input_path)
    base = input_path.rstrip("/")
    if fs.get_file_info(inner).type == pafs.FileType.File:
        base = base.rsplit("/", 1)[0]
    return f"{base}/{DEFAULT_SUBDIR}"


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
