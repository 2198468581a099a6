"""Ray Data's ``ray.data.block`` names a custom datasource uses: `BlockMetadata` and ``Block``.

A block here is a `pyarrow.Table` (a read task may also yield a `pandas.DataFrame` or a
dict of columns; the engine turns it into a table). Its metadata, given with each
`ReadTask`, is a hint the planner reads before the read: ``size_bytes`` sizes the task;
``num_rows``, ``input_files`` and ``schema`` fingerprint what it reads for commit
records. The true row counts and sizes are measured from the blocks the task yields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import pyarrow as pa

Block = Union[pa.Table, "pandas.DataFrame"]  # noqa: F821 - pandas is optional here


@dataclass
class BlockMetadata:
    """What is known of a block (or of a read task's blocks together) before it is read.

    Positional order as in current Ray (``num_rows, size_bytes, input_files, exec_stats``);
    older Ray's ``schema=`` is accepted by keyword (current Ray gives it to `ReadTask`).
    ``exec_stats`` is Ray's execution statistics object: kept, never read.
    """

    num_rows: int | None = None
    size_bytes: int | None = None
    input_files: list[str] | None = None
    exec_stats: Any = None
    schema: Any = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        for name in ("num_rows", "size_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"BlockMetadata: {name} must be an integer >= 0 or None, got {value!r}")
        if self.input_files is not None:
            self.input_files = [str(path) for path in self.input_files]


__all__ = ["Block", "BlockMetadata"]
