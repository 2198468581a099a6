"""``read_numpy``: Ray Data's reader of NumPy ``.npy`` files, one ``data`` column per file's array.

Why a module of its own: the other file readers share `read_api`'s listing and read tasks, and so
does this one, but its rows are arrays: each file's array of shape ``(n, *s)`` becomes ``n`` rows
of a tensor column of shape ``s`` (`worker/tensors.py`), the type ``write_numpy`` writes from.

It differs from Ray on purpose in one default: Ray loads with ``allow_pickle=True``, which runs
whatever a pickled object array in the file says; here pickles are refused unless the caller
passes ``allow_pickle=True`` for files they trust.
"""

from __future__ import annotations

import io

import numpy as np

from airflow_streambatch.engine.dataset import Dataset
from airflow_streambatch.engine.read_api import _check_blocks, _files, provider_paths
from airflow_streambatch.engine.path_args import normalize_paths
from airflow_streambatch.engine.read_options import FileOptions, file_options
from airflow_streambatch.engine.read_resources import with_read_resources
from airflow_streambatch.engine.worker.batches import from_udf_output

NUMPY_LOAD_ARGS = ("allow_pickle", "mmap_mode", "fix_imports", "encoding", "max_header_size")


@with_read_resources
def read_numpy(paths, *, filesystem=None, arrow_open_stream_args: dict | None = None, partitioning=None,
               include_paths: bool = False, ignore_missing_paths: bool = False,
               file_extensions: list[str] | None = ("npy",), partition_filter=None,
               override_num_blocks: int | None = None, meta_provider=None, shuffle=None,
               **numpy_load_args) -> Dataset:
    """``.npy`` files (a file, a directory, or a list; other extensions are skipped, as in Ray):
    each file's array is rows of a ``data`` column. ``**numpy_load_args`` go to ``numpy.load``."""
    _check_blocks(override_num_blocks, "read_numpy", meta_provider)
    paths = normalize_paths(paths, "read_numpy")
    unknown = sorted(set(numpy_load_args) - set(NUMPY_LOAD_ARGS))
    if unknown:
        raise TypeError(f"read_numpy: {unknown} are not arguments of numpy.load; it takes {list(NUMPY_LOAD_ARGS)}")
    opts = file_options("read_numpy", filesystem=filesystem, partitioning=partitioning, include_paths=include_paths,
                        ignore_missing_paths=ignore_missing_paths,
                        file_extensions=None if file_extensions is None else list(file_extensions),
                        arrow_open_stream_args=arrow_open_stream_args, partition_filter=partition_filter)
    paths = provider_paths(meta_provider, paths, opts)
    return _files("Numpy", paths, _numpy_reader(opts, numpy_load_args), opts, override_num_blocks, shuffle)


def _numpy_reader(opts: FileOptions, load_args: dict):
    def reader(fragment):
        with opts.open_stream(fragment.path) as handle:
            data = handle.read()
        try:
            array = np.load(io.BytesIO(data), **{"allow_pickle": False, **load_args})
        except ValueError as exc:
            raise ValueError(f"read_numpy: {exc} (pass allow_pickle=True to read_numpy "
                             "only for files you trust: a pickle runs code as it loads)") from exc
        yield opts.finish(from_udf_output({"data": array}, "read_numpy"), fragment.path)

    return reader
