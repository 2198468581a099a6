"""`BlockRef`: what the driver holds instead of a block's data.

Why here and not with the code that writes blocks (`worker/blocks.py`): the reference is the
contract both sides share. Tasks create them and announce them on their streams; the driver
queues, slices, orders, releases and rebuilds them (by lineage) without ever running executor
code. It is frozen: a reference is passed between operators and kept in ledgers, so a change
is a new reference (`slice`, `dataclasses.replace`), never an edit others would see.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class BlockRef:
    """A reference to one block; what the driver holds instead of data.

    :param block_id: unique within a run; encodes producer and position.
    :param path: the Arrow IPC file.
    :param num_rows: rows visible through this reference (after ``offset``/``length``).
    :param size_bytes: in-memory Arrow bytes of those rows.
    :param producer: ``(operator name, task key, index in the task's output stream)``.
    :param partitions: input (source) partitions this block descends from.
    :param offset, length: a row slice of the file; ``length=None`` means all rows.
        Slices let `limit` and `repartition` cut blocks without touching data.
    :param location: the block server of the host that holds the file (its host agent,
        `host_agent.py`); ``""`` where every reader sees the file at ``path`` (local mode).
    :param order: the block's place in input order: its task's ``order`` and its index in the
        task's output (a read task's order is its input partition). Blocks compare as tuples,
        so with ``preserve_order`` the consumer receives them sorted (`execution/ordering.py`).
    """

    block_id: str
    path: str
    num_rows: int
    size_bytes: int
    producer: tuple[str, str, int]
    partitions: tuple[int, ...]
    offset: int = 0
    length: int | None = None
    location: str = ""
    order: tuple[int, ...] = ()

    def slice(self, offset: int, length: int) -> BlockRef:
        """A view of ``length`` rows starting at ``offset`` of this view."""
        length = max(0, min(length, self.num_rows - offset))
        per_row = self.size_bytes / self.num_rows if self.num_rows else 0
        return replace(
            self,
            block_id=f"{self.block_id}[{self.offset + offset}:{self.offset + offset + length}]",
            offset=self.offset + offset,
            length=length,
            num_rows=length,
            size_bytes=int(per_row * length),
        )

    def to_wire(self) -> dict:
        """The JSON form a task announces a block in (`worker/streams.py`)."""
        return asdict(self)

    @classmethod
    def from_wire(cls, fields: dict) -> BlockRef:
        """The reference a JSON record holds; ``KeyError``/``TypeError``/``ValueError`` when it holds
        none. Trusting what it names is the reader's check (`execution/stream_watcher.py`)."""
        return cls(**dict(fields, producer=tuple(fields["producer"]), partitions=tuple(fields["partitions"]),
                          order=tuple(fields.get("order", ()))))
