"""Conditional writes on object stores: create-if-absent and replace-if-unchanged.

Why: S3, GCS and Azure have no rename and no lock, but they do have atomic
conditional writes (S3 ``If-None-Match: *`` and ``If-Match: <etag>``, GCS
``ifGenerationMatch``, Azure ``If-None-Match``/``If-Match``). The write lease and the
commit records rely on them, so that of two writers racing at the same instant exactly
one wins. pyarrow's filesystems do not expose them; ``obstore`` (Python bindings of the
Rust ``object_store`` crate that delta-rs also uses) does, for all three stores, and
reads the same environment as pyarrow and boto3 (``AWS_ENDPOINT_URL``, credentials,
``GOOGLE_*``, ``AZURE_*``).

Paths here are pyarrow's (``bucket/key``): the first component is the bucket or
container, the rest the key.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import pyarrow.fs as pafs

from airflow_streambatch.engine.filesystems import object_store_scheme


class PreconditionFailed(Exception):
    """A conditional write lost: the object exists (create), or changed since it was read (replace)."""


@dataclass(frozen=True)
class Versioned:
    """An object's bytes and the tag a conditional replace must match."""

    data: bytes
    e_tag: str


def _endpoint_is_http() -> bool:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return endpoint.startswith("http://")


_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                "AWS_ENDPOINT_URL_S3", "AWS_REGION", "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_STORAGE_ACCOUNT_NAME",
                "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN")


@functools.lru_cache(maxsize=64)
def _store(scheme: str, bucket: str, credentials: tuple):
    """A client per bucket and set of credentials (an epoch runs with its connection's: `hooks.object_store`)."""
    from obstore.store import from_url

    options = {"allow_http": True} if scheme == "s3" and _endpoint_is_http() else None
    return from_url(f"{scheme}://{bucket}", client_options=options)


def _split(fs: pafs.FileSystem, path: str):
    scheme = object_store_scheme(fs)
    if scheme is None:
        raise TypeError(f"{type(fs).__name__} is not an object store (S3, GCS or Azure)")
    bucket, _, key = path.lstrip("/").partition("/")
    return _store(scheme, bucket, tuple(os.environ.get(name) for name in _CREDENTIALS)), key


def create(fs: pafs.FileSystem, path: str, data: bytes) -> str:
    """Create ``path`` holding ``data`` unless it exists; the new object's tag. Raises
    `PreconditionFailed` when it exists (whoever created it, at whatever instant)."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    store, key = _split(fs, path)
    try:
        return obstore.put(store, key, data, mode="create")["e_tag"]
    except (AlreadyExistsError, PreconditionError) as exc:
        raise PreconditionFailed(path) from exc


def replace(fs: pafs.FileSystem, path: str, data: bytes, e_tag: str) -> str:
    """Replace ``path`` with ``data`` only if it still has tag ``e_tag``; the new tag. Raises
    `PreconditionFailed` when another writer replaced (or deleted) it since."""
    import obstore
    from obstore.exceptions import NotFoundError, PreconditionError

    store, key = _split(fs, path)
    try:
        return obstore.put(store, key, data, mode={"e_tag": e_tag})["e_tag"]
    except (PreconditionError, NotFoundError) as exc:
        raise PreconditionFailed(path) from exc


def read(fs: pafs.FileSystem, path: str) -> Versioned | None:
    """``path``'s bytes and tag, or None if it does not exist."""
    import obstore
    from obstore.exceptions import NotFoundError

    store, key = _split(fs, path)
    try:
        result = obstore.get(store, key)
    except (NotFoundError, FileNotFoundError):
        return None
    return Versioned(bytes(result.bytes()), result.meta["e_tag"])
