"""Drivers killed at a chosen instant: a writer script that stops (sleeps) where the test wants it
killed, and announces it by creating a flag file; the test then SIGKILLs it and its Spark JVM."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and its children (its Spark JVM): a killed driver cleans nothing up."""
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    for pid in children:
        subprocess.run(["kill", "-9", pid], check=False)


def kill_when_flagged(script: str, flag, log_path, bound_s: float = 240) -> None:
    """Run ``script`` in a new interpreter until it creates ``flag`` (within ``bound_s``), then kill it."""
    with open(log_path, "wb") as log:
        writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + bound_s
        while not flag.exists():
            assert writer.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, f"the writer never got there: {log_path.read_text()[-3000:]}"
            time.sleep(0.05)
    finally:
        kill_tree(writer)
