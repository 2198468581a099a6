"""Removing a write's ``_staging`` directory once no run's staging is left in it.

Each run removes its own ``_staging/<run id>/`` when it ends (`commit.PartitionCommitter.cleanup`);
``_staging`` itself would stay behind, empty, beside the committed partitions, where a reader
of the output path sees it. It goes only when empty: staging of another run (a driver that
died on another host, whose files the next writer there settles) is never touched. A new
run's staging appears only under the path's write lease, which the finishing run still holds.

On object stores a directory is a prefix: pyarrow's S3 filesystem keeps an empty parent
"directory" alive with a marker object after deleting what was under it, so an empty
``_staging`` is a marker object; deleting the directory deletes the marker.
"""

from __future__ import annotations

import logging
import os

import pyarrow.fs as pafs

log = logging.getLogger("airflow_streambatch.engine.progress")


def remove_if_empty(fs: pafs.FileSystem, path: str) -> bool:
    """Delete the directory ``path`` if it holds nothing; whether it is gone now."""
    try:
        if isinstance(fs, pafs.LocalFileSystem):
            os.rmdir(path)  # refuses, atomically, a directory that is not empty
            return True
        if fs.get_file_info(path).type != pafs.FileType.Directory:
            return fs.get_file_info(path).type == pafs.FileType.NotFound
        if fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)):
            return False
        fs.delete_dir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError as exc:  # not empty (local), or the store refused: leaving it is harmless
        log.debug("left %s in place: %s", path, exc)
        return False
