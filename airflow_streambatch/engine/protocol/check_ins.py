"""Check-ins as typed messages: a Spark partition's `CheckInCall` and the driver's `CheckInReply`.

Why: a partition that ran its tasks asks the driver for more (`worker/task_runner.run_partition`)
and the driver's desk routes the call to its scheduler loop (`execution/check_ins.py`). Both
sides build and read these types; ``to_wire``/``from_wire`` is the one JSON encoding of each
(pickled results and specs travel base64-encoded), so neither side spells the other's keys.

``CHECK_IN_WAIT_S`` bounds both ends: the partition waits that long for an answer, and the
driver abandons a call its loop did not answer in that time (the partition then ends).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

CHECK_IN_WAIT_S = 2.0  # how long a partition's check-in waits for the driver's answer before it ends


def _encode(blobs: list[bytes]) -> list[str]:
    return [base64.b64encode(blob).decode() for blob in blobs]


def _decode(texts: list[str]) -> list[bytes]:
    return [base64.b64decode(text) for text in texts]


@dataclass(frozen=True)
class CheckInCall:
    """One call of a partition: who calls (run, launch, Spark partition and attempt), its call
    number (a call repeated because its answer was lost carries the same one), and the
    pickled `TaskResult`s of the tasks it ran since its last call."""

    run: str
    launch: int
    part: int
    attempt: int
    seq: int
    results: list[bytes] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int, int, int]:
        """The partition attempt that calls: its calls are numbered by ``seq``."""
        return self.run, self.launch, self.part, self.attempt

    def to_wire(self) -> dict:
        return {"run": self.run, "launch": self.launch, "part": self.part, "attempt": self.attempt,
                "seq": self.seq, "results": _encode(self.results)}

    @classmethod
    def from_wire(cls, body: dict) -> CheckInCall:
        return cls(str(body["run"]), int(body["launch"]), int(body["part"]), int(body.get("attempt", 0)),
                   int(body["seq"]), _decode(body.get("results", [])))


@dataclass(frozen=True)
class CheckInReply:
    """The driver's answer: the next tasks (pickled `TaskSpec`s; none ends the partition), with
    their operator's pickled payload when it is not the one the partition ran until now."""

    specs: list[bytes] = field(default_factory=list)
    payload: bytes | None = None

    def to_wire(self) -> dict:
        wire: dict = {"specs": _encode(self.specs)}
        if self.payload is not None:
            wire["op"] = base64.b64encode(self.payload).decode()
        return wire

    @classmethod
    def from_wire(cls, body: dict) -> CheckInReply:
        payload = body.get("op")
        return cls(_decode(body.get("specs", [])), None if payload is None else base64.b64decode(payload))
