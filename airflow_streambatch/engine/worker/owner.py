"""Directories a driver owns: marked with its host and pid, swept once it is dead.

A driver that is killed cleans nothing up. The next run on the same host recognises
what it left (its run's block directory, its staging under an output path) by the
mark, and removes it; a mark of another host, or of a live process, is left alone.
"""

from __future__ import annotations

import os
import socket

OWNER_FILE = "_driver"


def owner_mark() -> str:
    """What a driver writes into ``OWNER_FILE`` of a directory it owns."""
    return f"{socket.gethostname()} {os.getpid()}"


def left_by_dead_driver(mark: str) -> bool:
    """True when ``mark`` names a process of this host that no longer runs."""
    try:
        host, pid = mark.split()
        pid_number = int(pid)
    except ValueError:
        return False
    return host == socket.gethostname() and not _alive(pid_number)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
