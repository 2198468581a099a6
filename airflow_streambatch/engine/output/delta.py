"""Delta Lake tables through ``deltalake`` (delta-rs): the `tables.TableFormat` for ``write_delta``.

A batch of partitions is one Delta transaction: an ``add`` action per data file, an
application transaction (``txn``) per partition named by its marker (so that two
writers committing the same partition at once conflict in delta-rs's conflict check),
and the partitions' records in the commit's metadata (``commitInfo.streambatch``), which
is where `markers` reads them from, back to the last overwrite or delete: rows removed
by an overwrite are no longer committed. delta-rs reads credentials and endpoints from
the environment, as pyarrow does.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import pyarrow.parquet as pq

from airflow_streambatch.engine.filesystems import resolve
from airflow_streambatch.engine.output.commit import CommitRecord
from airflow_streambatch.engine.output.tables import Pending, TableFormat, check_not_committed, marker, require

METADATA_KEY = "streambatch"
_RESETS = ("DELETE", "CREATE OR REPLACE TABLE", "RESTORE")  # operations after which earlier markers are void


def default_storage_options(uri: str) -> dict[str, str]:
    """delta-rs needs to be told that a plain-HTTP S3 endpoint (a local server) is meant."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return {"AWS_ALLOW_HTTP": "true"} if uri.startswith("s3") and endpoint.startswith("http://") else {}


class DeltaFormat(TableFormat):
    name = "delta"

    def __init__(self, uri: str, storage_options: dict[str, str] | None = None):
        require("deltalake", "write_delta")
        self.uri = uri.rstrip("/")
        self.options = {**default_storage_options(self.uri), **(storage_options or {})}

    def data_path(self) -> str:
        return self.uri

    def _table(self):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri, storage_options=self.options)
        except TableNotFoundError:
            return None

    def markers(self, key: str) -> dict[int, CommitRecord]:
        table = self._table()
        return {} if table is None else _markers_of(table, key)

    def commit(self, key: str, batch: list[Pending]) -> None:
        from deltalake import Schema
        from deltalake.transaction import AddAction, CommitProperties, Transaction, create_table_with_add_actions

        version = int(time.time() * 1000)  # txn versions only grow
        properties = CommitProperties(
            custom_metadata={METADATA_KEY: json.dumps({"key": key, "records": [asdict(p.record) for p in batch]})},
            app_transactions=[Transaction(marker(key, p.record.partition), version) for p in batch],
            max_commit_retries=0)  # a concurrent commit fails this one: the markers are read again, not rebased
        now_ms = int(time.time() * 1000)
        actions = [AddAction(name, f.bytes, {}, now_ms, True, json.dumps({"numRecords": f.rows}))
                   for p in batch for f, name in zip(p.files, p.record.files) if f.rows]
        table = self._table()
        if table is None and not actions:
            return  # only empty partitions and no table yet: nothing to record them in (a resume reruns them)
        first = next((name for p in batch for f, name in zip(p.files, p.record.files) if f.rows), None)
        schema = self._schema(f"{self.uri}/{first}") if first else table.schema().to_arrow()
        if table is None:  # "error": of two writers creating the table, the second fails and is settled
            create_table_with_add_actions(self.uri, Schema.from_arrow(schema), actions, mode="error",
                                          storage_options=self.options, commit_properties=properties)
            return
        check_not_committed(_markers_of(table, key), batch)  # on the version this commit is based on
        table.create_write_transaction(actions, mode="append", schema=schema, commit_properties=properties)

    def truncate(self) -> None:
        table = self._table()
        if table is not None:
            table.delete()

    def has_rows(self) -> bool:
        table = self._table()
        return table is not None and bool(table.file_uris())

    @staticmethod
    def _schema(path: str):
        fs, inner = resolve(path)
        return pq.read_schema(inner, filesystem=fs)


def _markers_of(table, key: str) -> dict[int, CommitRecord]:
    """The records of ``key`` in ``table``'s history (newest first), back to the last overwrite or delete."""
    found: dict[int, CommitRecord] = {}
    for entry in table.history():
        if entry.get("operation") in _RESETS or (entry.get("operation") == "WRITE" and
                                                 entry.get("operationParameters", {}).get("mode") == "Overwrite"):
            break
        raw = entry.get(METADATA_KEY)
        data = json.loads(raw) if raw else {}
        if data.get("key") == key:
            for rec in data.get("records", []):
                found.setdefault(rec["partition"], CommitRecord(**rec))
    return found
