"""What any local user could read while a test runs: every process's command line, as ``ps`` shows it."""

from __future__ import annotations

import os
import stat
import threading
import time


class ArgvWatcher(threading.Thread):
    """Reads every process's ``/proc/<pid>/cmdline`` every 20 ms while the ``with`` block runs.

    ``seen``: pid -> argv of the Spark processes (JVMs, spark-submit); ``leaked``: every argv
    holding one of ``secrets``; ``properties``: each ``--properties-file`` a Spark process
    was started with, path -> (mode, text), read while it existed.
    """

    def __init__(self, secrets: tuple[bytes, ...] = ()):
        super().__init__(daemon=True)
        self.secrets = secrets
        self.seen: dict[int, bytes] = {}
        self.leaked: list[bytes] = []
        self.properties: dict[str, tuple[int, str]] = {}
        self._stop_event = threading.Event()

    def __enter__(self) -> ArgvWatcher:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop_event.set()
        self.join()

    @property
    def spark_submit_jvms(self) -> list[bytes]:
        return [argv for argv in self.seen.values() if b"org.apache.spark.deploy.SparkSubmit" in argv]

    def private_properties_text(self) -> str:
        """The text of the properties files seen, after checking that there was one, that each was 0600
        while it existed and that each is gone now (the run deleted it)."""
        assert self.properties, "no Spark process was started with --properties-file"
        assert {mode for mode, _ in self.properties.values()} == {0o600}
        assert not any(os.path.exists(path) for path in self.properties)
        return "".join(text for _, text in self.properties.values())

    def run(self) -> None:
        while not self._stop_event.is_set():
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        argv = f.read()
                except OSError:
                    continue
                if any(secret in argv for secret in self.secrets):
                    self.leaked.append(argv)
                if b"org.apache.spark" in argv or b"spark-submit" in argv:
                    self.seen[int(pid)] = argv
                    self._read_properties(argv.split(b"\0"))
            time.sleep(0.02)

    def _read_properties(self, args: list[bytes]) -> None:
        if b"--properties-file" not in args:
            return
        path = args[args.index(b"--properties-file") + 1].decode()
        try:
            with open(path, encoding="utf-8") as f:
                self.properties[path] = (stat.S_IMODE(os.stat(path).st_mode), f.read())
        except OSError:
            pass
