"""Whether a host's block directory can hold ``DataContext.memory_limit`` of blocks.

Why at start, and an error rather than a warning: blocks live in tmpfs by default
(``/dev/shm``), which a Kubernetes pod caps at 64 MiB and a Docker container at 64 MiB
unless told otherwise, while ``memory_limit`` defaults to a quarter of the machine's
memory. A run that buffers more than the directory holds dies mid-way with "no space
left on device" after doing part of its work; refusing before the first task, naming
both settings and both values, costs nothing and says what to change. The driver checks
its own host before a run starts (for the whole limit in local mode, which keeps every
block there); each executor host checks, when its host agent starts, that it holds what
one task needs (`check_block_room`).
"""

from __future__ import annotations


from airflow_streambatch.engine.errors import StreamBatchError, human_bytes
from airflow_streambatch.engine.filesystems import free_bytes


class BlockDirTooSmallError(StreamBatchError):
    """The block directory has less free space than ``DataContext.memory_limit``."""


def check_block_room(block_dir: str, memory_limit: int, host: str = "the driver's host",
                     block_bytes: int | None = None) -> None:
    """Raise `BlockDirTooSmallError` naming the settings when ``block_dir`` cannot hold what this host may get.

    In local mode the driver's host keeps every block: it must hold ``memory_limit``. On a
    cluster (``block_bytes``: `DataContext.target_max_block_size`) each host, the driver's
    included, must hold two blocks, what one task needs to read one and write the next
    (the driver: what it fetches): the run's ``memory_limit`` is spread over the executor
    hosts as Spark places tasks, and a driver on a large machine (a quarter of its memory
    by default) would otherwise refuse every smaller executor.
    """
    need = memory_limit if block_bytes is None else min(memory_limit, 2 * block_bytes)
    free = free_bytes(str(block_dir))
    if free >= need:
        return
    if block_bytes is None:
        what = f"less than DataContext.memory_limit={memory_limit} ({human_bytes(memory_limit)})"
    else:
        what = (f"less than the two blocks of DataContext.target_max_block_size={block_bytes} "
                f"({human_bytes(2 * block_bytes)}) one task needs (DataContext.memory_limit={memory_limit} is "
                "spread over the executor hosts)")
    raise BlockDirTooSmallError(
        f"DataContext.block_dir={str(block_dir)!r} has {human_bytes(free)} free on {host}, {what}: a run would fail "
        "with 'no space left on device'. Lower memory_limit (target_max_block_size follows it), point block_dir at a "
        "larger filesystem, or give the block directory more room (/dev/shm in a Kubernetes pod: an emptyDir volume "
        "with medium: Memory and a sizeLimit, mounted at /dev/shm; Docker: --shm-size). See docs/network.md")
