"""The output layer's one object: an output path opened for writing.

Why: a write needs three things that belong together, the path's filesystem, its write
lease and its commit protocol, and three callers need them (``write_*``, the executor
that commits, ``run_epoch`` that keeps its epoch record beside the output). The caller
opens the target, which takes the lease, hands it down, and closes it when done, which
gives the lease back: no process-wide registry, nothing guessed from threads.

    with OutputTarget.open("s3://bucket/scores/2026-11-22") as target:
        ds.write_parquet(target, mode="resume")
"""

from __future__ import annotations

import logging

import pyarrow.fs as pafs

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.errors import StreamBatchError
from airflow_streambatch.engine.filesystems import resolve_in
from airflow_streambatch.engine.output import lease as write_lease
from airflow_streambatch.engine.output.commit import CommitRecord, PartitionCommitter

log = logging.getLogger("airflow_streambatch.engine.progress")

WRITE_MODES = ("append", "resume", "overwrite", "error", "ignore")


class OutputExistsError(StreamBatchError, FileExistsError, ValueError):
    """``mode="error"`` and the output path exists. Ray Data raises ``ValueError`` here; it is also
    a ``FileExistsError``, which is what this engine raised before it followed Ray."""


class OutputTarget:
    """An output path whose write lease this process holds, until `close`.

    ``existed``: whether the path existed before `open` took the lease (which creates the
    directory and its ``_lease``): Ray Data's ``"error"`` and ``"ignore"`` modes decide by it.
    """

    def __init__(self, path: str, lease: write_lease.WriteLease, filesystem=None, existed: bool = False):
        self.path = path.rstrip("/")
        self.filesystem = filesystem  # Ray Data's filesystem= (None: the path's scheme says)
        self.fs, root = resolve_in(self.path, filesystem)
        self.root = root.rstrip("/")
        self.lease = lease
        self.existed = existed

    @classmethod
    def open(cls, path: str, *, timeout_s: float | None = None, ttl_s: float | None = None,
             filesystem=None) -> OutputTarget:
        """Take ``path``'s write lease, waiting up to ``timeout_s`` (default
        ``DataContext.write_lease_timeout_s``) for another writer, then raising
        `WriteLeaseHeldError` naming it. ``filesystem``: a `pyarrow.fs.FileSystem` the path
        is in (Ray Data's ``filesystem=``), instead of the one its scheme names."""
        ctx = DataContext.get_current()
        fs, root = resolve_in(path.rstrip("/"), filesystem)
        existed = path_exists(fs, root)
        lease = write_lease.acquire(fs, root, "preparing", ctx.write_lease_timeout_s if timeout_s is None
                                    else timeout_s, ctx.write_lease_ttl_s if ttl_s is None else ttl_s)
        return cls(path, lease, filesystem, existed)

    def committer(self, run_id: str, mode: str | None = "resume") -> PartitionCommitter:
        """A committer for one engine run, committing under this target's lease. An append
        beside earlier writes names its partition directories with the run id."""
        committer = PartitionCommitter(self.path, run_id, None, self.lease, self.filesystem)
        if mode in ("append", None) and committer.scan():
            committer.tag = run_id
        return committer

    def prepare(self, mode: str | None) -> dict[int, CommitRecord] | None:
        """Apply ``mode`` to what the path already holds, before anything runs.

        Returns the committed records when the write must not run (``"ignore"`` and the
        path exists), else None. ``"error"`` and ``"ignore"`` follow Ray Data: the path exists
        if it existed when the target was opened (an empty directory too), or holds output
        now (another writer's, committed between). Only partitions an earlier write committed are
        ever deleted (``"overwrite"``); anything else under the path stops the write.
        ``None`` (the default) appends, as Ray Data does, unless the last write under
        the path did not finish: then it refuses and names ``"resume"`` and ``"append"``,
        so that rerunning a failed write never adds a silent second copy.
        """
        inspect = PartitionCommitter(self.path, run_id="inspect", lease=self.lease, filesystem=self.filesystem)
        if mode is None:
            _refuse_unfinished(self.path, inspect)
            return None
        if mode == "append":
            return None
        committed = inspect.scan()
        if mode == "resume":
            appended = sorted(name for name in committed if "-" in name)
            if appended:
                raise ValueError(f"{self.path} holds partitions of append writes ({', '.join(appended[:3])}...): "
                                 "mode='resume' continues a write that owns the path; write to a new path, or use "
                                 "mode='overwrite'")
            return None
        foreign = inspect.foreign_entries()
        exists = self.existed or bool(committed or foreign)
        if mode == "ignore" and exists:
            log.warning("mode='ignore': %s already exists; writing nothing", self.path)
            return {rec.partition: rec for rec in committed.values()}
        if mode == "error" and exists:
            held = (f"it already holds output ({len(committed)} committed partition(s), {len(foreign)} other "
                    "entries)" if committed or foreign else "an empty directory")
            raise OutputExistsError(f"Path {self.path} already exists: {held}. If this is unexpected, use "
                                    "mode='ignore' to ignore those files; or choose mode='overwrite', 'append' or "
                                    "'resume', or write to a new path")
        if mode == "overwrite":
            if foreign:
                raise FileExistsError(f"{self.path} holds {', '.join(foreign[:5])}, which no write of this engine "
                                      "committed; mode='overwrite' deletes only committed partitions: move them, or "
                                      "write elsewhere")
            log.info("overwrite: deleted %d committed partition(s) under %s", inspect.wipe(), self.path)
        return None

    def close(self) -> None:
        """Give the lease back (idempotent)."""
        self.lease.release()

    def __enter__(self) -> OutputTarget:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def path_exists(fs: pafs.FileSystem, root: str) -> bool:
    """Whether ``root`` exists on ``fs``, as Ray Data's file writes ask: a file or a directory,
    empty or not (on an object store, a prefix with objects under it)."""
    return fs.get_file_info(root).type != pafs.FileType.NotFound


def _refuse_unfinished(path: str, inspect: PartitionCommitter) -> None:
    last = inspect.last_write()
    if last is None or last.get("state") == "finished":
        return
    done = sum(1 for rec in inspect.scan().values() if rec.run_id == last.get("run_id"))
    raise FileExistsError(
        f"{path} holds an unfinished write (run {last.get('run_id')}, {done} partition(s) committed, then it "
        "failed or was stopped): mode='resume' finishes it, computing only the missing partitions; "
        "mode='append' adds a second copy beside it; mode='overwrite' replaces it")
