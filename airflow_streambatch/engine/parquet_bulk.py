"""``read_parquet_bulk``: Ray Data's read of many Parquet files, named one by one, without reading
their footers up front.

Why a module of its own: it differs from ``read_parquet`` in what it does before a run, which is
nothing but filtering the names it was given. Paths are taken as files (a directory fails the read,
naming it, unless ``meta_provider=DefaultFileMetadataProvider()`` lists it when the function is
called, as in Ray); ``file_extensions`` (``["parquet"]`` by default) filters the names right away
and leaving none is Ray's ``ValueError``; no footer is read until the dataset runs, so ``count()``
and ``repr`` know nothing before then; each file is read with its own schema (Ray's use of it: files
that do not share one); there are no partition columns (Ray's bulk read has no ``partitioning``)
and each file is one fragment (no row-group split).
"""

from __future__ import annotations

from airflow_streambatch.engine.dataset import Dataset
from airflow_streambatch.engine.errors import NoInputFilesError
from airflow_streambatch.engine.parquet_args import applied, block_fn, check_parquet_args
from airflow_streambatch.engine.parquet_ranges import read_row_groups
from airflow_streambatch.engine.path_args import FileOrder, check_shuffle, normalize_paths
from airflow_streambatch.engine.plan.datasource import Datasource, Fragment, file_datasource
from airflow_streambatch.engine.plan.logical import Read
from airflow_streambatch.engine.read_api import _check_blocks, _file_source, provider_paths
from airflow_streambatch.engine.read_options import FileOptions, file_options
from airflow_streambatch.engine.read_pruning import check_columns
from airflow_streambatch.engine.read_resources import with_read_resources

WHERE = "read_parquet_bulk"


@with_read_resources
def read_parquet_bulk(paths, *, filesystem=None, columns: list[str] | None = None,
                      arrow_open_file_args: dict | None = None, tensor_column_schema: dict | None = None,
                      meta_provider=None, partition_filter=None, shuffle=None, include_paths: bool = False,
                      file_extensions: list[str] | None = ("parquet",), override_num_blocks: int | None = None,
                      **arrow_parquet_args) -> Dataset:
    """Parquet files given one by one (see the module doc): ``columns``, ``include_paths``,
    ``partition_filter``, ``shuffle``, ``tensor_column_schema`` and ``arrow_parquet_args``
    (``batch_size``, ``_block_udf``) as ``read_parquet`` takes them. ``arrow_open_file_args`` are
    pyarrow's ``open_input_file`` options, of which there are none: only empty is accepted."""
    _check_blocks(override_num_blocks, WHERE, meta_provider)
    paths, order = normalize_paths(paths, WHERE), FileOrder(check_shuffle(shuffle, WHERE))
    if arrow_open_file_args:
        raise ValueError(f"{WHERE}: arrow_open_file_args={arrow_open_file_args!r}: pyarrow's open_input_file takes "
                         "no options")
    opts = file_options(WHERE, filesystem=filesystem, partitioning=None, include_paths=include_paths,
                        file_extensions=None if file_extensions is None else list(file_extensions),
                        partition_filter=partition_filter)
    columns = check_columns(columns, WHERE)
    batch_size, block_udf = check_parquet_args(arrow_parquet_args, WHERE)
    per_table = block_fn(tensor_column_schema, block_udf, WHERE)
    files = _with_extensions(provider_paths(meta_provider, paths, opts), opts)
    listing = {**opts.listing(), "files_only": WHERE}

    def reader(fragment: Fragment):
        return read_row_groups(fragment, opts, None, fragment.path, columns, None, WHERE, batch_size)

    def plan(slots: int, override: int | None, target_bytes: int):
        source = file_datasource("ParquetBulk", order(files), (), applied(reader, per_table), listing=listing)
        return source.plan(slots, override, target_bytes)

    return Dataset([Read(_file_source(Datasource("ParquetBulk", plan), files), override_num_blocks)])


def _with_extensions(paths: str | list[str], opts: FileOptions) -> list[str]:
    """The names that end in one of ``file_extensions``, filtered now as Ray filters them when the
    read is created; none left is Ray's `ValueError` (and this engine's `FileNotFoundError`)."""
    paths = [paths] if isinstance(paths, str) else list(paths)
    if opts.file_extensions is None:
        return paths
    ends = tuple("." + e for e in opts.file_extensions)
    kept = [path for path in paths if path.lower().endswith(ends)]
    if not kept:
        raise NoInputFilesError(f"No input files found to read with the following file extensions: "
                                f"{list(opts.file_extensions)} among {paths}; check the extensions, or pass "
                                "file_extensions=None")
    return kept
