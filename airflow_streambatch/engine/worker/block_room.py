"""Whether a host's block directory can hold ``DataContext.memory_limit`` of blocks.

Why at start, and an error rather than a warning: blocks live in tmpfs by default
(``/dev/shm``), which a Kubernetes pod caps at 64 MiB and a Docker container at 64 MiB
unless told otherwise, while ``memory_limit`` defaults to a quarter of the machine's
memory. A run that buffers more than the directory holds dies mid-way with "no space
left on device" after doing part of its work; refusing before the first task, naming
both settings and both values, costs nothing and says what to change. The driver checks
its own host before a run starts; each executor host checks when its host agent starts
(every block of a run may land on one host, so each host must hold the whole limit).
"""

from __future__ import annotations

import os

from airflow_streambatch.engine.errors import StreamBatchError


class BlockDirTooSmallError(StreamBatchError):
    """The block directory has less free space than ``DataContext.memory_limit``."""


def free_bytes(path: str) -> int:
    """Free bytes for this user on the filesystem of ``path`` (or of its nearest existing parent)."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    st = os.statvfs(path or "/")
    return st.f_bavail * st.f_frsize


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def check_block_room(block_dir: str, memory_limit: int, host: str = "the driver's host") -> None:
    """Raise `BlockDirTooSmallError` naming both settings when ``block_dir`` cannot hold ``memory_limit``."""
    free = free_bytes(str(block_dir))
    if free >= memory_limit:
        return
    raise BlockDirTooSmallError(
        f"DataContext.block_dir={str(block_dir)!r} has {_human(free)} free on {host}, less than "
        f"DataContext.memory_limit={memory_limit} ({_human(memory_limit)}): a run that buffers that much would "
        f"fail with 'no space left on device'. Set memory_limit to at most {free}, point block_dir at a larger "
        "filesystem, or give the block directory more room (/dev/shm in a Kubernetes pod: an emptyDir volume with "
        "medium: Memory and a sizeLimit, mounted at /dev/shm; Docker: --shm-size). See docs/network.md")
