"""Frontiers: when have an epoch's inputs stopped changing?

A frontier is a lower bound on the times of data still to come (the timestamp
tokens of timely dataflow, Naiad's progress tracking): once it passes the interval's end, the epoch's
inputs are complete. Each check here answers that from what a producer leaves
behind: a marker file, a watermark it advances, a partition directory it publishes
whole, or, lacking all of these, files that stayed unchanged for a quiet period.

Every frontier answers ``poll(interval_end, listing, state, now) -> (passed, state)``
so the sensor and its trigger treat them alike; ``state`` is JSON the caller keeps
between polls (only quiescence needs it).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import datetime

import pyarrow.fs as pafs

from airflow_streambatch.engine.filesystems import resolve


def _exists(path: str) -> bool:
    fs, inner = resolve(path)
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


@dataclass(frozen=True)
class MarkerFile:
    """Complete when ``path`` exists (e.g. ``in/2026-11-22/_SUCCESS``)."""

    path: str

    def passed(self, interval_end: datetime) -> bool:
        return _exists(self.path)

    def poll(self, interval_end: datetime, listing: dict, state: dict | None, now: float) -> tuple[bool, dict | None]:
        return self.passed(interval_end), state


@dataclass(frozen=True)
class PartitionDirectory:
    """Complete when the partition directory exists and holds input files (e.g. ``in/ds=2026-11-22/``,
    published by renaming a finished directory into place, as Hive-style producers do)."""

    path: str

    def poll(self, interval_end: datetime, listing: dict, state: dict | None, now: float) -> tuple[bool, dict | None]:
        return _exists(self.path) and bool(listing), state


@dataclass(frozen=True)
class Watermark:
    """Complete when the ISO-8601 timestamp in ``path`` is at or past the interval's end."""

    path: str

    def passed(self, interval_end: datetime) -> bool:
        if not _exists(self.path):
            return False
        fs, inner = resolve(self.path)
        with fs.open_input_stream(inner) as f:
            text = f.read().decode().strip()
        try:
            mark = datetime.fromisoformat(text)
        except ValueError as exc:
            raise ValueError(f"watermark file {self.path} must hold an ISO-8601 timestamp, got {text!r}") from exc
        if (mark.tzinfo is None) != (interval_end.tzinfo is None):
            raise ValueError(f"watermark {text!r} in {self.path} and the interval end {interval_end.isoformat()} "
                             "must both carry a timezone (or both not)")
        return mark >= interval_end

    def poll(self, interval_end: datetime, listing: dict, state: dict | None, now: float) -> tuple[bool, dict | None]:
        return self.passed(interval_end), state


@dataclass(frozen=True)
class Quiescence:
    """Complete when the input listing has not changed for ``quiet_period_s`` seconds.

    Pokes are independent (a rescheduled sensor is a new process), so ``observe``
    takes and returns a small JSON state for the caller to keep between pokes.
    """

    quiet_period_s: float

    def poll(self, interval_end: datetime, listing: dict, state: dict | None, now: float) -> tuple[bool, dict]:
        return self.observe(state, listing, now)

    def observe(self, state: dict | None, listing: dict, now: float) -> tuple[bool, dict]:
        """``listing`` maps path -> [size, mtime]; returns (passed, state to keep)."""
        if state is None or state.get("listing") != listing:
            state = {"listing": listing, "since": now}
        return bool(listing) and now - state["since"] >= self.quiet_period_s, state


FRONTIERS = ("marker", "watermark", "directory", "quiescence")


@dataclass(frozen=True)
class FrontierSpec:
    """Which frontier an epoch waits for, as the sensor's arguments say: what `EpochSensor`,
    `EpochTrigger` (through `to_dict`/`from_dict`, its serialized form) and `make_frontier` share.

    :param kind: one of `FRONTIERS`.
    :param input_path: the epoch's input directory or glob.
    :param marker_path: ``kind="marker"``: the marker file; default ``<input_path>/_SUCCESS``.
    :param watermark_path: ``kind="watermark"`` (required): a file holding an ISO-8601 timestamp.
    :param quiet_period_s: ``kind="quiescence"``: seconds the listing must stay unchanged (> 0).
    """

    kind: str
    input_path: str
    marker_path: str | None = None
    watermark_path: str | None = None
    quiet_period_s: float = 300.0

    def __post_init__(self) -> None:
        if self.kind not in FRONTIERS:
            close = difflib.get_close_matches(str(self.kind), FRONTIERS, n=1)
            raise ValueError(f"frontier={self.kind!r} is not one of {FRONTIERS}"
                             f"{f'. Did you mean {close[0]!r}?' if close else ''}")
        if self.kind == "watermark" and not self.watermark_path:
            raise ValueError("frontier='watermark' needs watermark_path: a file holding an ISO-8601 timestamp")
        if self.kind == "quiescence" and self.quiet_period_s <= 0:
            raise ValueError(f"quiet_period must be positive for frontier='quiescence', got {self.quiet_period_s}")

    def to_dict(self) -> dict:
        """The spec under the sensor's and trigger's keyword names (``frontier``, ``input_path``, ...)."""
        return {"frontier": self.kind, "input_path": self.input_path, "marker_path": self.marker_path,
                "watermark_path": self.watermark_path, "quiet_period_s": self.quiet_period_s}

    @classmethod
    def from_dict(cls, data: dict) -> FrontierSpec:
        """The inverse of `to_dict`."""
        return cls(kind=data["frontier"], input_path=data["input_path"], marker_path=data.get("marker_path"),
                   watermark_path=data.get("watermark_path"), quiet_period_s=data.get("quiet_period_s", 300.0))

    def build(self):
        """The frontier object (`MarkerFile`, `Watermark`, `PartitionDirectory` or `Quiescence`)."""
        if self.kind == "marker":
            return MarkerFile(self.marker_path or f"{self.input_path.rstrip('/')}/_SUCCESS")
        if self.kind == "watermark":
            return Watermark(self.watermark_path)
        if self.kind == "directory":
            return PartitionDirectory(self.input_path)
        return Quiescence(self.quiet_period_s)


def make_frontier(kind: str, input_path: str, *, marker_path: str | None = None, watermark_path: str | None = None,
                  quiet_period_s: float = 300.0):
    """The frontier a sensor's arguments describe (``kind`` is one of `FRONTIERS`); see `FrontierSpec`."""
    return FrontierSpec(kind, input_path, marker_path, watermark_path, quiet_period_s).build()
