"""Directories a driver owns: marked with its host and pid, swept once it is dead.

A driver that is killed cleans nothing up. The next run on the same host recognises
what it left (its run's block directory, its staging under an output path, its write
lease) by the mark, and removes it; a mark of another host, or of a live process, is
left alone: a live run's directories are never swept, whoever else runs on the host.
"""

from __future__ import annotations

import os
import socket

OWNER_FILE = "_driver"


def this_host() -> str:
    """The host name marks carry: a pid is only checkable on the host that ran it."""
    return socket.gethostname()


def owner_mark() -> str:
    """What a driver writes into ``OWNER_FILE`` of a directory it owns."""
    return f"{this_host()} {os.getpid()}"


def left_by_dead_driver(mark: str) -> bool:
    """True when ``mark`` names a process of this host that no longer runs."""
    try:
        host, pid = mark.split()
        pid_number = int(pid)
    except ValueError:
        return False
    return left_by_dead_process(host, pid_number)


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs. A zombie (killed, not yet reaped by its parent) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True  # no /proc: the signal check is all there is


def process_start(pid: int) -> str:
    """When ``pid`` started (clock ticks since boot, from ``/proc``), or "" where that cannot be read.

    A pid alone can name a new process after the old one died (a restarted container
    counts its pids from 1 again); the start time tells them apart.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return ""
    return fields[19] if len(fields) > 19 else ""  # field 22 of stat; the list starts at field 3


def left_by_dead_process(host: str, pid: int, started: str = "") -> bool:
    """True when ``pid`` of ``host`` (this host) no longer runs, or runs as another process than
    the one that started at ``started`` (see `process_start`)."""
    if host != this_host():
        return False
    if not process_alive(pid):
        return True
    now = process_start(pid)
    return bool(started and now and now != started)
