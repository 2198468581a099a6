"""Ray Data's ``SaveMode`` (``from ray.data import SaveMode``), for ``write_*(mode=...)``.

A string enum, as Ray's is, so ``SaveMode.ERROR == "error"`` and a member goes wherever the
mode's string goes. Ray's file writes decide ``ERROR`` and ``IGNORE`` by whether the output
path exists (an empty directory counts); the engine does the same (`output/target.py`) and keeps
its own exactly-once commits for what it writes.
"""

from __future__ import annotations

from enum import Enum


class SaveMode(str, Enum):
    """What a write does with an output path that already exists.

    ``APPEND`` adds its files beside what is there (Ray's default); ``OVERWRITE`` replaces what
    earlier writes committed; ``IGNORE`` writes nothing, and runs nothing, when the path exists;
    ``ERROR`` raises when the path exists. The engine's ``"resume"`` mode has no member: Ray has
    no such mode; pass the string.
    """

    APPEND = "append"
    OVERWRITE = "overwrite"
    IGNORE = "ignore"
    ERROR = "error"

    def __str__(self) -> str:  # in messages, the mode as a user spells it
        return self.value


def mode_string(mode):
    """``mode`` as the engine's string (a `SaveMode` member's value); anything else unchanged."""
    return mode.value if isinstance(mode, SaveMode) else mode
