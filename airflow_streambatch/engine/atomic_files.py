"""Local files written whole: to a temporary name beside the target, then renamed over it.

Why: readers never see a half-written file. Another process polls or reads these
files while they are written (a task polls its grant file, the driver memory-maps
blocks a task announced, spark-submit reads its properties and spec, the sweep reads
a run's owner mark), and a writer killed midway leaves the old file or none, never a
torn one. ``os.replace`` is atomic within one filesystem, which the temporary name
beside the target guarantees. Files are created 0600 by default: they hold users'
data and secrets, and the mode is set when the file is created, before any byte lands.

Writes through a pyarrow filesystem (S3, HDFS, ...) have no such rename and do their
their own protocols (`engine/output/protocols.py`).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator


@contextlib.contextmanager
def atomic_output(path: str, mode: int = 0o600) -> Iterator[str]:
    """A temporary path beside ``path``, created empty with ``mode``, for the ``with`` block to
    write (for writers that want a path, such as Arrow's); renamed to ``path`` when the block
    ends, removed if it raises."""
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def atomic_write(path: str, data: bytes | str, mode: int = 0o600) -> None:
    """Write ``data`` (``str`` as UTF-8) to the local file ``path`` so that readers see the old
    contents or all of the new, never part: through a temporary file created with ``mode``."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_output(path, mode) as tmp, open(tmp, "wb") as f:
        f.write(data)
