"""The memory budget and its ledger: `MemoryBudget`, `BlockLedger` (on real block files in a
tmp dir, no Spark). Memory grants to running tasks are in test_memory_grants.py."""
from __future__ import annotations

import os
from dataclasses import dataclass, field


from airflow_streambatch.engine.execution.memory import BlockLedger, MemoryBudget
from airflow_streambatch.engine.execution.operators import Operator
from airflow_streambatch.engine.execution.stats import OpStats
from airflow_streambatch.engine.protocol.blocks import BlockRef

# -- MemoryBudget -----------------------------------------------------------------------


def test_room_is_what_neither_blocks_nor_reservations_hold():
    m = MemoryBudget(limit=100, used=30, reserved=20.5)
    assert m.room() == 49.5
    m.used = 90
    assert m.room() == 0.0  # over the limit: no room, never negative
    m.used, m.reserved = 0, 0.0
    assert m.room() == 100


def test_unreserve_never_goes_below_zero():
    m = MemoryBudget(limit=100, reserved=10.0)
    m.unreserve(4)
    assert m.reserved == 6.0
    m.unreserve(50)
    assert m.reserved == 0.0
    assert m.room() == 100


# -- BlockLedger ------------------------------------------------------------------------


@dataclass
class LedgerOp:
    index: int
    largest_block: int = 0
    buffered_output_bytes: int = 0
    stats: OpStats = field(default_factory=lambda: OpStats("op"))
    output_added = Operator.output_added  # the ledger counts through the operator's own methods
    output_freed = Operator.output_freed


def block_file(tmp_path, name: str) -> str:
    path = tmp_path / name
    path.write_bytes(b"arrow")
    return str(path)


def ref(path: str, block_id: str, size: int, rows: int = 10) -> BlockRef:
    return BlockRef(block_id=block_id, path=path, num_rows=rows, size_bytes=size, producer=("Op", "t", 0),
                    partitions=(0,))


def ledger_with(ops=2, limit=1000):
    operators = [LedgerOp(i) for i in range(ops)]
    return BlockLedger(MemoryBudget(limit=limit), operators), operators


def test_add_counts_used_peak_buffered_and_largest_block(tmp_path):
    ledger, (a, b) = ledger_with()
    ledger.add(a, ref(block_file(tmp_path, "1"), "0:t:0", 300))
    ledger.add(a, ref(block_file(tmp_path, "2"), "0:t:1", 100))
    ledger.add(b, ref(block_file(tmp_path, "3"), "1:t:0", 50))
    assert ledger.memory.used == 450 and ledger.memory.peak == 450
    assert (a.buffered_output_bytes, b.buffered_output_bytes) == (400, 50)
    assert (a.largest_block, b.largest_block) == (300, 50)
    assert a.stats.peak_buffered_bytes == 400 and b.stats.peak_buffered_bytes == 50


def test_release_frees_bytes_of_the_owner_and_the_peak_stays(tmp_path):
    ledger, (a, b) = ledger_with()
    first, second = ref(block_file(tmp_path, "1"), "0:t:0", 300), ref(block_file(tmp_path, "2"), "1:t:0", 100)
    ledger.add(a, first)
    ledger.add(b, second)
    ledger.release(first)
    assert ledger.memory.used == 100 and ledger.memory.peak == 400
    assert (a.buffered_output_bytes, b.buffered_output_bytes) == (0, 100)
    assert not os.path.exists(first.path) and os.path.exists(second.path)
    assert a.stats.peak_buffered_bytes == 300


def test_slices_sharing_a_file_delete_it_only_at_the_last_release(tmp_path):
    ledger, (a, _) = ledger_with()
    whole = ref(block_file(tmp_path, "0-t-0.arrow"), "0:t:0", 300, rows=30)
    parts = [whole.slice(0, 10), whole.slice(10, 10), whole.slice(20, 10)]
    assert len({p.block_id for p in parts}) == 3 and {p.path for p in parts} == {whole.path}
    for part in parts:
        ledger.add(a, part)
    assert ledger.memory.used == 300 and ledger.holds(whole.path)
    ledger.release(parts[1])
    ledger.release(parts[0])
    assert os.path.exists(whole.path) and ledger.holds(whole.path)
    assert ledger.memory.used == a.buffered_output_bytes == 100
    ledger.release(parts[2])
    assert not os.path.exists(whole.path) and not ledger.holds(whole.path)
    assert ledger.memory.used == a.buffered_output_bytes == 0


def test_release_without_delete_keeps_the_file(tmp_path):
    ledger, (a, _) = ledger_with()
    block = ref(block_file(tmp_path, "kept"), "0:t:0", 64)
    ledger.add(a, block)
    ledger.release(block, delete=False)  # a materialized dataset's block: this run does not own the file
    assert os.path.exists(block.path)
    assert ledger.memory.used == 0 and a.buffered_output_bytes == 0 and not ledger.holds(block.path)


def test_a_split_moves_ownership_and_frees_the_cut_bytes(tmp_path):
    ledger, (a, b) = ledger_with()
    whole = ref(block_file(tmp_path, "w"), "0:t:0", 100, rows=10)
    ledger.add(b, whole)
    part = whole.slice(0, 3)  # a limit keeps three rows
    ledger.split(whole, [part])
    assert ledger.memory.used == b.buffered_output_bytes == 30
    ledger.release(whole)  # the whole block is no longer tracked
    assert ledger.memory.used == 30 and os.path.exists(whole.path)
    ledger.release(part)  # the slice owns the file now
    assert ledger.memory.used == b.buffered_output_bytes == 0 and a.buffered_output_bytes == 0
    assert not os.path.exists(whole.path)


def test_pieces_of_a_split_block_share_its_file_until_the_last_is_released(tmp_path):
    ledger, (a, _) = ledger_with()
    whole = ref(block_file(tmp_path, "w"), "0:t:0", 100, rows=10)
    ledger.add(a, whole)
    pieces = [whole.slice(0, 4), whole.slice(4, 3), whole.slice(7, 3)]  # three tasks' inputs
    ledger.split(whole, pieces)
    assert ledger.memory.used == a.buffered_output_bytes == 100
    for piece in pieces[:2]:
        ledger.release(piece)
        assert os.path.exists(whole.path)
    ledger.release(pieces[2])
    assert not os.path.exists(whole.path) and ledger.memory.used == a.buffered_output_bytes == 0


def test_a_split_of_an_unknown_block_does_nothing(tmp_path):
    ledger, (a, _) = ledger_with()
    whole = ref(block_file(tmp_path, "w"), "0:t:0", 100)
    ledger.split(whole, [whole.slice(0, 1)])
    assert ledger.memory.used == 0 and a.buffered_output_bytes == 0


def test_releasing_an_unknown_or_released_ref_is_a_no_op(tmp_path):
    ledger, (a, _) = ledger_with()
    tracked = ref(block_file(tmp_path, "t"), "0:t:0", 100)
    stranger = ref(block_file(tmp_path, "s"), "0:t:9", 70)
    ledger.add(a, tracked)
    ledger.release(stranger)
    assert os.path.exists(stranger.path)
    assert ledger.memory.used == a.buffered_output_bytes == 100
    ledger.release(tracked)
    block_file(tmp_path, "t")  # the same path again (as a new attempt would write it)
    ledger.release(tracked)  # released twice: counted once, and the new file survives
    assert ledger.memory.used == 0 and a.buffered_output_bytes == 0
    assert os.path.exists(tracked.path)


def test_release_of_a_file_already_gone_is_fine(tmp_path):
    ledger, (a, _) = ledger_with()
    block = ref(block_file(tmp_path, "g"), "0:t:0", 10)
    ledger.add(a, block)
    os.remove(block.path)
    ledger.release(block)
    assert ledger.memory.used == 0
