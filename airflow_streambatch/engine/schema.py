"""`Schema`: what ``Dataset.schema()`` returns, Ray Data's wrapper around the Arrow schema.

Ray Data code reads ``schema.names`` and ``schema.types``, compares schemas with
``==`` and prints them as a two-column table; all of that behaves as in Ray
(``ray.data.Schema``), a tensor column printed as Ray prints one,
``numpy.ndarray(shape=(2, 3), dtype=int64)`` (`worker/tensors.py`). The Arrow schema
itself is ``base_schema``. Code written for this engine before it returned a
`pyarrow.Schema` keeps working: other attributes
(``field``, ``metadata``, ...) are the Arrow schema's, and a `Schema` equals a
`pyarrow.Schema` with the same names and types.
"""

from __future__ import annotations

import pyarrow as pa

from airflow_streambatch.engine.worker.tensors import type_name


class Schema:
    """A dataset's columns and their types (``base_schema``: the `pyarrow.Schema`)."""

    def __init__(self, base_schema: pa.Schema):
        if isinstance(base_schema, Schema):
            base_schema = base_schema.base_schema
        if not isinstance(base_schema, pa.Schema):
            raise TypeError(f"Schema expects a pyarrow.Schema, got {type(base_schema).__name__}")
        self.base_schema = base_schema

    @property
    def names(self) -> list[str]:
        """The column names, in order."""
        return list(self.base_schema.names)

    @property
    def types(self) -> list[pa.DataType]:
        """The Arrow type of each column, in the order of ``names``."""
        return list(self.base_schema.types)

    def __eq__(self, other) -> bool:
        if isinstance(other, pa.Schema):
            other = Schema(other)
        return isinstance(other, Schema) and other.names == self.names and other.types == self.types

    def __hash__(self) -> int:
        return hash((tuple(self.names), tuple(str(t) for t in self.types)))

    def __len__(self) -> int:
        return len(self.base_schema)

    def __getattr__(self, name: str):
        # only called for names Schema lacks: the Arrow schema's own (field, metadata, ...)
        if name == "base_schema" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.base_schema, name)

    def __repr__(self) -> str:
        """Ray's table: ``Column``/``Type`` headings, then one line per column, names padded to
        the longest name plus two spaces."""
        width = max([len("Column"), *map(len, self.names)]) + 2
        lines = ["Column".ljust(width) + "Type", "------".ljust(width) + "----"]
        lines += [name.ljust(width) + type_name(dtype) for name, dtype in zip(self.names, self.types)]
        return "\n".join(lines)

    __str__ = __repr__
