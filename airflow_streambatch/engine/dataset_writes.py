"""Ray Data's ``write_parquet``, ``write_json``, ``write_csv`` and ``write_numpy``, on `Dataset`.

Each write stages its files per partition and commits each partition at once
(`output/commit.py`, `docs/reliability.md`). A partition is an input partition,
or after a ``repartition(n)`` one of its ``n`` output blocks: the repartition mixes
every input partition into every output block, so the barrier relabels its output
(`PartitionTracker.relabel_at_barrier`) and the write commits per output block.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from airflow_streambatch.engine.execution.partitions import WriteResult
from airflow_streambatch.engine.filesystems import check_disjoint
from airflow_streambatch.engine.path_args import comparable_uri, normalize_path
from airflow_streambatch.engine.output.commit import CommitRecord
from airflow_streambatch.engine.output.tables import TableTarget
from airflow_streambatch.engine.output.target import WRITE_MODES, OutputTarget
from airflow_streambatch.engine.plan.logical import Read, Repartition, ResourceRequest, WriteFiles
from airflow_streambatch.engine.save_mode import mode_string
from airflow_streambatch.engine.worker.sinks import SinkOptions

OnCommit = Callable[[CommitRecord], None] | None
Path = str | os.PathLike | OutputTarget


class DatasetWrites:
    """Mixed into `Dataset`; relies on its ``_logical``, ``_with`` and ``_iter_refs``."""

    def write_parquet(self, path: Path, *, mode: str | None = None, on_commit: OnCommit = None,
                      min_rows_per_file: int | None = None, max_rows_per_file: int | None = None,
                      num_rows_per_file: int | None = None, arrow_open_stream_args: dict[str, Any] | None = None,
                      filesystem=None, **arrow_parquet_args) -> WriteResult:
        """Parquet files under ``path/p<partition>/``, each partition committed at once.

        ``path`` is a path or URI (``s3://``, ``gs://``, ``abfs://``: `docs/reliability.md`
        says how commits work there), or an `OutputTarget` the caller opened and closes.
        ``mode`` says what happens to output already under ``path``: ``"append"``
        (add this write's partitions beside it), ``None`` (the default: append, as Ray
        Data does, but refuse a path whose last write did not finish, naming ``"resume"``
        and ``"append"``, so a rerun never adds a silent second copy), ``"resume"``
        (finish an interrupted write: partitions committed from the same input are
        skipped without running, a partition whose input changed is refused; not after a
        ``repartition``), ``"overwrite"`` (delete what earlier writes committed, then
        write), ``"error"`` (refuse if the path exists, an empty directory too, as Ray Data
        does: ``ValueError``, also a ``FileExistsError``) or ``"ignore"`` (run and write nothing
        if the path exists); Ray's ``SaveMode`` members work too. ``on_commit`` is called in
        the driver with each partition's commit record as it lands (the Airflow operator
        records progress with it). See ``docs/reliability.md`` for how readers see only
        committed rows.

        As in Ray Data, ``min_rows_per_file`` bundles input blocks until a file gets that
        many rows (within a partition and ``DataContext.target_max_block_size``: a hint),
        ``max_rows_per_file`` starts a new file once one has that many rows,
        ``num_rows_per_file`` is the deprecated name of ``min_rows_per_file``, and
        ``**arrow_parquet_args`` go to ``pyarrow.parquet.ParquetWriter`` (``compression``,
        ``compression_level``, ``use_dictionary``, ...), except ``row_group_size``, which
        goes to each ``write_table``. ``arrow_open_stream_args`` takes ``buffer_size``.
        ``path`` may be a ``pathlib.Path``; ``filesystem`` (a `pyarrow.fs.FileSystem`, as Ray takes
        it) is the filesystem ``path`` is in, for the files, the lease and the commit alike.
        """
        options = SinkOptions.make("parquet", min_rows_per_file=min_rows_per_file, max_rows_per_file=max_rows_per_file,
                                   num_rows_per_file=num_rows_per_file, arrow_open_stream_args=arrow_open_stream_args,
                                   format_args=arrow_parquet_args, filesystem=filesystem)
        return self._write(path, "parquet", mode, on_commit, options)

    def write_json(self, path: Path, *, mode: str | None = None, on_commit: OnCommit = None,
                   min_rows_per_file: int | None = None, max_rows_per_file: int | None = None,
                   num_rows_per_file: int | None = None, arrow_open_stream_args: dict[str, Any] | None = None,
                   filesystem=None, **pandas_json_args) -> WriteResult:
        """JSON Lines files (``.jsonl``), committed per partition like `write_parquet`, with its
        ``mode``, ``on_commit`` and rows-per-file arguments.

        Ray writes with pandas ``to_json(orient="records", lines=True)``; that output is what
        is written here, and other ``**pandas_json_args`` are refused. With
        ``arrow_open_stream_args={"compression": "gzip"}`` (or ``bz2``, ``zstd``, ``lz4``,
        ``brotli``) each file is compressed and named ``.jsonl.gz`` etc., which readers infer.
        """
        options = SinkOptions.make("json", min_rows_per_file=min_rows_per_file, max_rows_per_file=max_rows_per_file,
                                   num_rows_per_file=num_rows_per_file, arrow_open_stream_args=arrow_open_stream_args,
                                   format_args=pandas_json_args, filesystem=filesystem)
        return self._write(path, "json", mode, on_commit, options)

    def write_csv(self, path: Path, *, mode: str | None = None, on_commit: OnCommit = None,
                  min_rows_per_file: int | None = None, max_rows_per_file: int | None = None,
                  num_rows_per_file: int | None = None, arrow_open_stream_args: dict[str, Any] | None = None,
                  filesystem=None, **arrow_csv_args) -> WriteResult:
        """CSV files with a header, committed per partition like `write_parquet`, with its
        ``mode``, ``on_commit`` and rows-per-file arguments.

        ``**arrow_csv_args`` are those of ``pyarrow.csv.write_csv``, as in Ray: ``write_options``
        (a ``pyarrow.csv.WriteOptions``). ``arrow_open_stream_args={"compression": "gzip"}``
        compresses each file and names it ``.csv.gz``, so ``read_csv`` infers the codec.
        """
        options = SinkOptions.make("csv", min_rows_per_file=min_rows_per_file, max_rows_per_file=max_rows_per_file,
                                   num_rows_per_file=num_rows_per_file, arrow_open_stream_args=arrow_open_stream_args,
                                   format_args=arrow_csv_args, filesystem=filesystem)
        return self._write(path, "csv", mode, on_commit, options)

    def write_numpy(self, path: Path, *, column: str, mode: str | None = None, on_commit: OnCommit = None,
                    min_rows_per_file: int | None = None, max_rows_per_file: int | None = None,
                    num_rows_per_file: int | None = None, arrow_open_stream_args: dict[str, Any] | None = None,
                    filesystem=None) -> WriteResult:
        """``column`` as NumPy ``.npy`` files (one array of the file's rows each: a tensor column of
        shape ``s`` gives an array of shape ``(rows, *s)``), committed per partition like
        `write_parquet`, with its ``mode``, ``on_commit`` and rows-per-file arguments. Saved without
        pickles, so a column of Python objects fails naming NumPy's ``allow_pickle``."""
        options = SinkOptions.make("numpy", min_rows_per_file=min_rows_per_file, max_rows_per_file=max_rows_per_file,
                                   num_rows_per_file=num_rows_per_file, arrow_open_stream_args=arrow_open_stream_args,
                                   format_args={"column": column}, filesystem=filesystem)
        return self._write(path, "numpy", mode, on_commit, options)

    def write_delta(self, path: str, *, mode: str = "append", idempotence_key: str | None = None,
                    storage_options: dict[str, str] | None = None, on_commit: OnCommit = None,
                    min_rows_per_file: int | None = None, max_rows_per_file: int | None = None,
                    **arrow_parquet_args) -> WriteResult:
        """Append to the Delta table at ``path`` (created on the first commit), exactly once per
        partition: partitions are committed in batches of Delta transactions, each partition with
        its idempotence marker (an application transaction), `output/tables.py`.

        ``mode``: ``"append"``, ``"resume"`` (skip partitions already committed under
        ``idempotence_key``, default ``"default"``), ``"overwrite"`` (delete every row first, in
        one transaction), ``"error"`` or ``"ignore"`` (when the table has rows).
        ``storage_options`` go to delta-rs; other arguments are those of `write_parquet`.
        """
        from airflow_streambatch.engine.output.delta import DeltaFormat

        target = TableTarget(DeltaFormat(path, storage_options), idempotence_key)
        return self._write(target, "parquet", mode, on_commit, self._table_sink_options(
            "delta", min_rows_per_file, max_rows_per_file, arrow_parquet_args))

    def write_iceberg(self, table_identifier: str, catalog_kwargs: dict | None = None,
                      snapshot_properties: dict[str, str] | None = None, mode: str = "append", *,
                      idempotence_key: str | None = None, on_commit: OnCommit = None,
                      min_rows_per_file: int | None = None, max_rows_per_file: int | None = None,
                      **arrow_parquet_args) -> WriteResult:
        """Append to the existing Iceberg table ``table_identifier`` (Ray Data's arguments:
        ``catalog_kwargs`` for ``pyiceberg.catalog.load_catalog``, default the embedded SQLite
        catalog; ``snapshot_properties`` added to every snapshot), exactly once per partition:
        batches of partitions per snapshot, each partition with its marker in the snapshot's
        summary. ``mode`` and ``idempotence_key`` as in `write_delta`.
        """
        from airflow_streambatch.engine.output.iceberg import IcebergFormat

        target = TableTarget(IcebergFormat(table_identifier, catalog_kwargs, snapshot_properties), idempotence_key)
        return self._write(target, "parquet", mode, on_commit, self._table_sink_options(
            "iceberg", min_rows_per_file, max_rows_per_file, arrow_parquet_args))

    @staticmethod
    def _table_sink_options(where: str, min_rows, max_rows, arrow_parquet_args) -> SinkOptions:
        options = SinkOptions.make("parquet", min_rows_per_file=min_rows, max_rows_per_file=max_rows,
                                   format_args=arrow_parquet_args)
        options.table = where
        return options

    def _write(self, path: Path | TableTarget, file_format: str, mode: str | None, on_commit: OnCommit,
               options: SinkOptions) -> WriteResult:
        mode = mode_string(mode)  # Ray's SaveMode members are their strings
        if mode is not None and mode not in WRITE_MODES:
            raise ValueError(f"write_{options.table or file_format}(mode={mode!r}): mode must be one of "
                             f"{WRITE_MODES}, or None")
        if mode == "resume" and any(isinstance(op, Repartition) for op in self._logical):
            raise ValueError(
                f"write_{options.table or file_format}(mode='resume') after repartition(): a resumed write skips the "
                "partitions an earlier run committed, but each block of a repartition holds rows of every input "
                "partition, so no committed block can be matched to its input; use mode='overwrite' to write it again"
            )
        where = f"write_{options.table or file_format}"
        if isinstance(path, (OutputTarget, TableTarget)) and options.filesystem is not None:
            raise ValueError(f"{where}: filesystem= goes with a path; an OutputTarget already has its filesystem "
                             "(OutputTarget.open(path, filesystem=...))")
        uri = path.path if isinstance(path, (OutputTarget, TableTarget)) else normalize_path(path, where)
        source = self._logical[0]
        if isinstance(source, Read):
            check_disjoint(source.datasource.paths, comparable_uri(uri, options.filesystem), where)
        target = path if isinstance(path, (OutputTarget, TableTarget)) else OutputTarget.open(
            uri, filesystem=options.filesystem)
        if isinstance(target, OutputTarget):
            options.filesystem = target.filesystem  # the sink tasks write where the target commits
        try:
            existing = target.prepare(mode)
            if existing is not None:  # mode="ignore" and the path holds output
                return WriteResult(uri, skipped=existing)
            name = f"Write{(options.table or file_format).capitalize()}"
            committer_path = target.table.data_path() if isinstance(target, TableTarget) else uri
            sink = WriteFiles(name=name, compute=ResourceRequest.make(name), path=committer_path,
                              file_format=file_format, options=options, staged=not isinstance(target, TableTarget))
            written = self._with(sink)
            for _ in written._iter_refs(on_commit=on_commit, write_mode=mode, target=target):
                pass
        finally:
            if target is not path:
                target.close()
        executor = written._last_executor
        self._last_stats = written._last_stats
        return WriteResult(committer_path, dict(executor.partitions.committed), dict(executor.skipped),
                           list(executor.partitions.failures.values()))
