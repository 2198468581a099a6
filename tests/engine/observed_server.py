"""A real control server for tests that need to know when a task is waiting for its grant.

A task sends its wait record, then asks for the grant; once its request is counted
here, the driver holds the wait record and the task blocks (or is about to) on it.
"""

from __future__ import annotations

import threading
from collections import Counter

from airflow_streambatch.engine.execution.control_server import ControlServer


class ObservedServer(ControlServer):
    """A real control server that also counts the grant requests that reached it: a task
    sends its wait record, then asks for the grant, so once its request is counted the
    driver holds the wait record and the task blocks (or is about to) on its grant."""

    def __init__(self, host: str):
        super().__init__(host)
        self.asked = threading.Condition()
        self.grant_requests: Counter[tuple[str, int]] = Counter()

    def _grant(self, body: dict) -> dict:
        with self.asked:
            self.grant_requests[(body["stream"], int(body["index"]))] += 1
            self.asked.notify_all()
        return super()._grant(body)

    def wait_asked(self, name: str, index: int, times: int = 1, timeout: float = 5.0) -> None:
        with self.asked:
            ok = self.asked.wait_for(lambda: self.grant_requests[(name, index)] >= times, timeout=timeout)
        assert ok, f"stream {name} did not ask {times} time(s) for block {index} within {timeout} s"
