"""Apache Iceberg tables through ``pyiceberg``: the `tables.TableFormat` for ``write_iceberg``.

A batch of partitions is one snapshot: ``add_files`` of their Parquet files (written by
the sink tasks under the table's ``data/`` location), with one snapshot-summary
property per partition (its marker, holding its record). `markers` walks the current
snapshot's ancestry back to the last overwrite or delete. pyiceberg commits with
optimistic concurrency (the catalog swaps the metadata pointer only if it did not move),
so a conflicting writer fails, re-reads the markers and retries (`tables.TableCommitter`).

As in Ray Data, the table must exist; ``catalog_kwargs`` go to ``pyiceberg.catalog.
load_catalog``. Without them the catalog is the embedded default: a SQL catalog on
SQLite under ``~/.streambatch/iceberg`` (``name="default"``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

from airflow_streambatch.engine.output.commit import CommitRecord
from airflow_streambatch.engine.output.tables import Pending, TableFormat, check_not_committed, marker, require

_RESETS = ("overwrite", "delete")  # snapshot operations after which earlier markers are void


def default_catalog_kwargs() -> dict:
    home = os.path.expanduser("~/.streambatch/iceberg")
    os.makedirs(home, mode=0o700, exist_ok=True)
    return {"name": "default", "type": "sql", "uri": f"sqlite:///{home}/catalog.db", "warehouse": f"file://{home}"}


def _s3_endpoint() -> dict:
    """pyiceberg's S3 FileIO does not read ``AWS_ENDPOINT_URL``: pass it on, as pyarrow and delta-rs see it."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return {"s3.endpoint": endpoint} if endpoint else {}


class IcebergFormat(TableFormat):
    name = "iceberg"

    def __init__(self, identifier: str, catalog_kwargs: dict | None = None, snapshot_properties: dict | None = None):
        require("pyiceberg", "write_iceberg")
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError

        kwargs = {**_s3_endpoint(), **(catalog_kwargs or default_catalog_kwargs())}
        self.identifier = identifier
        self.catalog = load_catalog(kwargs.pop("name", "default"), **kwargs)
        self.snapshot_properties = dict(snapshot_properties or {})
        try:
            table = self.catalog.load_table(identifier)
        except NoSuchTableError as exc:
            raise ValueError(f"write_iceberg: table {identifier!r} does not exist in catalog {self.catalog.name!r}; "
                             "create it first (pyiceberg: catalog.create_table(identifier, schema)), as Ray Data "
                             "requires too") from exc
        self.uri = table.location().rstrip("/")

    def data_path(self) -> str:
        return f"{self.uri}/data"

    def markers(self, key: str) -> dict[int, CommitRecord]:
        return _markers_of(self.catalog.load_table(self.identifier), key)

    def commit(self, key: str, batch: list[Pending]) -> None:
        table = self.catalog.load_table(self.identifier)
        check_not_committed(_markers_of(table, key), batch)  # the catalog refuses the commit if the table moved
        properties = {**self.snapshot_properties,
                      **{marker(key, p.record.partition): json.dumps(asdict(p.record)) for p in batch}}
        paths = [f"{self.data_path()}/{name}" for p in batch for f, name in zip(p.files, p.record.files) if f.rows]
        if paths:
            table.add_files(paths, snapshot_properties=properties, check_duplicate_files=False)
        else:  # empty partitions: an empty append records their markers
            import pyarrow as pa

            table.append(pa.Table.from_pylist([], schema=table.schema().as_arrow()), snapshot_properties=properties)

    def truncate(self) -> None:
        from pyiceberg.expressions import AlwaysTrue

        table = self.catalog.load_table(self.identifier)
        if table.current_snapshot() is not None:
            table.delete(AlwaysTrue())

    def has_rows(self) -> bool:
        table = self.catalog.load_table(self.identifier)
        snapshot = table.current_snapshot()
        return snapshot is not None and int((snapshot.summary or {}).get("total-records", "0") or 0) > 0


def _markers_of(table, key: str) -> dict[int, CommitRecord]:
    """The records of ``key`` in the current snapshot's ancestry, back to the last overwrite or delete."""
    from pyiceberg.table.snapshots import ancestors_of

    prefix = marker(key, 0)[:-len("00000")]
    found: dict[int, CommitRecord] = {}
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary
        if summary is None:
            continue
        if summary.operation.value in _RESETS:
            break
        for name, value in summary.additional_properties.items():
            if name.startswith(prefix):
                rec = CommitRecord(**json.loads(value))
                found.setdefault(rec.partition, rec)
    return found
