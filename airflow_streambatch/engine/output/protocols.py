"""Commit protocols: how a partition's staged files become visible, chosen by the filesystem.

Sink tasks stage a partition's files under ``_staging/<run id>/p<partition>/``, which
every reader skips (``_``-prefixed). Committing makes them visible under
``p<partition>/`` with the partition's record ``_commit.json``:

* `RenameCommit` (local and POSIX filesystems, HDFS): the record is written into the
  staged directory, then the directory is renamed into place. One rename makes rows and
  record visible together; a driver killed at any instant leaves all or nothing.
* `CopyCommit` (S3, GCS, Azure: no rename). The record is created first, with a
  conditional create (`stores.create`): it is the commit point, and of two writers only
  one commits a partition. Then each staged file is copied (server side) to its final,
  deterministic name; each appears whole, as objects do. Then the staging goes. A plain
  reader of the directory sees no file of the partition, then its files one by one, each
  whole, never a file of an uncommitted partition or a row twice. A driver killed among
  the copies leaves a committed partition with some files still only staged: the next
  writer (which holds the lease, so the killed run is gone) finishes the copies before it
  does anything else (`settle`), and a reader that honours the records sees the
  partition once its listed files are all there.
"""

from __future__ import annotations

import logging

import pyarrow.fs as pafs

from airflow_streambatch.engine.filesystems import object_store_scheme
from airflow_streambatch.engine.output import stores
from airflow_streambatch.engine.protocol.staging import RECORD

log = logging.getLogger("airflow_streambatch.engine.progress")


class CommittedElsewhere(FileExistsError):
    """The partition was committed by another writer while this run computed it."""


class RenameCommit:
    """Filesystems with an atomic directory rename."""

    name = "rename"

    def __init__(self, fs: pafs.FileSystem):
        self.fs = fs

    def write_whole(self, path: str, data: bytes) -> None:
        """Write a small file so that a reader sees none of it or all of it."""
        tmp = f"{path}.tmp"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        self.fs.move(tmp, path)

    def publish(self, staged: str, final: str, names: list[str], record: bytes) -> None:
        self.fs.create_dir(staged, recursive=True)
        with self.fs.open_output_stream(f"{staged}/{RECORD}") as out:
            out.write(record)
        try:
            self.fs.move(staged, final)  # the commit: rows and record appear together
        except OSError as exc:
            if self.fs.get_file_info(f"{final}/{RECORD}").type != pafs.FileType.NotFound:
                raise CommittedElsewhere(final) from exc
            raise

    def settle(self, run_staging: str, committed_by_run: dict) -> None:
        """Nothing to finish: a rename committed a partition whole or not at all."""

    def delete_partition(self, final: str) -> None:
        self.fs.delete_dir(final)


class CopyCommit:
    """Object stores: no rename, whole-object writes, conditional creates."""

    name = "copy"

    def __init__(self, fs: pafs.FileSystem):
        self.fs = fs

    def write_whole(self, path: str, data: bytes) -> None:
        with self.fs.open_output_stream(path) as out:  # an object appears whole when its upload completes
            out.write(data)

    def publish(self, staged: str, final: str, names: list[str], record: bytes) -> None:
        try:
            stores.create(self.fs, f"{final}/{RECORD}", record)  # the commit point
        except stores.PreconditionFailed as exc:
            raise CommittedElsewhere(final) from exc
        self._copy(staged, final, names)

    def settle(self, run_staging: str, committed_by_run: dict) -> None:
        """Finish the copies of partitions whose record a run created but whose files it did not
        all copy (``committed_by_run``: staged partition directory name -> the final directory and
        file names of its record). A record that does not exist decides the other way: nothing."""
        for info in self.fs.get_file_info(pafs.FileSelector(run_staging, allow_not_found=True)):
            if info.type != pafs.FileType.Directory or info.base_name not in committed_by_run:
                continue
            final, names = committed_by_run[info.base_name]
            if self.fs.get_file_info(f"{final}/{RECORD}").type == pafs.FileType.NotFound:
                continue  # never committed (its record's create failed): the staging is just removed
            present = {i.base_name for i in self.fs.get_file_info(pafs.FileSelector(info.path))}
            log.warning("finishing the commit of %s, which a run that stopped during it left half copied", final)
            self._copy(info.path, final, [n for n in names if n in present])

    def delete_partition(self, final: str) -> None:
        """The record goes first: a partition is never listed as committed with files missing."""
        try:
            self.fs.delete_file(f"{final}/{RECORD}")
        except FileNotFoundError:
            pass
        self.fs.delete_dir(final)

    def _copy(self, staged: str, final: str, names: list[str]) -> None:
        """Copy, then delete the copied files one request each (``delete_dir`` costs 5: a listing,
        markers); what else the staged directory holds goes with the run's staging."""
        for name in names:
            self.fs.copy_file(f"{staged}/{name}", f"{final}/{name}")
        for name in names:
            self.fs.delete_file(f"{staged}/{name}")


def protocol_for(fs: pafs.FileSystem) -> RenameCommit | CopyCommit:
    return CopyCommit(fs) if object_store_scheme(fs) is not None else RenameCommit(fs)
