"""A pyarrow filesystem that counts the bytes read through it, wherever it is used.

`counting_filesystem(inner, log_dir)` wraps any pyarrow filesystem (local, S3) in a
`pyarrow.fs.PyFileSystem`; every read of an opened file appends its byte count to a file
under ``log_dir``, so reads on Spark's executors (which unpickle their own copy, this
module being importable there through the tests' PYTHONPATH) are counted too.
`bytes_read(log_dir)` sums them. It is how the pruning tests see what pyarrow fetched.
"""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.fs as pafs


class _CountingFile:
    """A Python file object over a pyarrow input file; each read is logged."""

    def __init__(self, raw, log_dir: str):
        self._raw, self._log = raw, os.path.join(log_dir, f"{os.getpid()}-{uuid.uuid4().hex}.reads")
        self.closed = False

    def _count(self, n: int) -> None:
        with open(self._log, "a") as f:
            f.write(f"{n}\n")

    def read(self, nbytes: int = -1) -> bytes:
        data = self._raw.read() if nbytes is None or nbytes < 0 else self._raw.read(nbytes)
        self._count(len(data))
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def size(self) -> int:
        return self._raw.size()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._raw.close()


class CountingHandler(pafs.FileSystemHandler):
    """Delegates everything to ``inner``; input files opened through it count their reads."""

    def __init__(self, inner: pafs.FileSystem, log_dir: str):
        self.inner, self.log_dir = inner, log_dir

    def __reduce__(self):
        return CountingHandler, (self.inner, self.log_dir)

    def __eq__(self, other):
        return isinstance(other, CountingHandler) and (self.inner, self.log_dir) == (other.inner, other.log_dir)

    def __ne__(self, other):
        return not self == other

    def get_type_name(self):
        return "counting+" + self.inner.type_name

    def normalize_path(self, path):
        return self.inner.normalize_path(path)

    def get_file_info(self, paths):
        return self.inner.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.inner.get_file_info(selector)

    def open_input_file(self, path):
        return pa.PythonFile(_CountingFile(self.inner.open_input_file(path), self.log_dir), mode="r")

    def open_input_stream(self, path):
        return self.open_input_file(path)

    def create_dir(self, path, recursive):
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        self.inner.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path):
        self.inner.delete_file(path)

    def move(self, src, dest):
        self.inner.move(src, dest)

    def copy_file(self, src, dest):
        self.inner.copy_file(src, dest)

    def open_output_stream(self, path, metadata):
        return self.inner.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.inner.open_append_stream(path, metadata=metadata)


def counting_filesystem(inner: pafs.FileSystem, log_dir) -> pafs.PyFileSystem:
    os.makedirs(log_dir, exist_ok=True)
    return pafs.PyFileSystem(CountingHandler(inner, str(log_dir)))


def bytes_read(log_dir) -> int:
    """Bytes read so far through the filesystems logging to ``log_dir`` (and forget them)."""
    total = 0
    for name in os.listdir(log_dir):
        path = os.path.join(log_dir, name)
        with open(path) as f:
            total += sum(int(line) for line in f if line.strip())
        os.remove(path)
    return total
