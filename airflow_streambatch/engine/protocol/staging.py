"""The staged side of exactly-once output: where sink tasks put their files, and what
they report (`output/commit.py` commits them).

A contract, not executor code: sink tasks (`worker/sinks.py`, `worker/row_errors.py`) write
this layout and report `StagedFile`s in their results; the driver's commit (`engine/output`)
and partition tracker (`execution/partitions.py`) read the same layout and records.

A task stages ``<path>/_staging/<run id>/p<partition>/part-<task key>.<ext>``; the
driver later writes the partition's record ``_commit.json`` into that directory and
renames it into place.
"""

from __future__ import annotations

from dataclasses import dataclass

RECORD = "_commit.json"


@dataclass(frozen=True)
class StagedFile:
    """One file a sink task staged, as it reports it to the driver."""

    path: str
    rows: int
    bytes: int
    schema: list[list[str]]


def partition_dir(partition: int, tag: str | None = None) -> str:
    return f"p{partition:05d}" if tag is None else f"p{partition:05d}-{tag}"


def schema_columns(schema) -> list[list[str]]:
    """A pyarrow schema as JSON-friendly ``[[name, type], ...]`` (metadata ignored)."""
    return [[f.name, str(f.type)] for f in schema]


def staging_dir(root: str, run_id: str, partition: int) -> str:
    """Where sink tasks write ``run_id``'s files of ``partition`` under the sink's ``root``."""
    return f"{root.rstrip('/')}/_staging/{run_id}/{partition_dir(partition)}"
