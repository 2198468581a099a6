"""Streaming repartition: bounded, deterministic block cuts."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

import airflow_streambatch.engine as sb
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.worker.blocks import BlockBuilder


def _cuts(tables, target):
    out = []

    def emit(table):
        out.append(table)
        return BlockRef(str(len(out)), "", table.num_rows, table.nbytes, ("op", "t", len(out)), ())

    builder = BlockBuilder(target, emit)
    for table in tables:
        list(builder.add(table))
    list(builder.finish())
    return out


def _tables(seed):
    rng = np.random.default_rng(seed)
    return [pa.table({"x": rng.integers(0, 100, size=int(n))}) for n in rng.integers(1, 5000, size=30)]


def test_blocks_never_exceed_target_and_keep_every_row():
    tables = _tables(1)
    blocks = _cuts(tables, 64 * 1024)
    assert all(b.nbytes <= 64 * 1024 for b in blocks)
    assert pa.concat_tables(blocks).equals(pa.concat_tables(tables))


def test_blocks_of_uneven_rows_never_exceed_target():
    """Cut by the mean row size, large rows then small ones passed the target (a grant
    sized for one full block was then too small)."""
    rows = [bytes(10_000)] * 100 + [bytes(100)] * 900  # 1 MB, then 90 KB
    blocks = _cuts([pa.table({"b": rows})], 200_000)
    assert all(b.nbytes <= 200_000 for b in blocks)
    assert sum(b.num_rows for b in blocks) == 1000


def test_same_input_and_target_give_same_blocks():
    first = _cuts(_tables(7), 50_000)
    second = _cuts(_tables(7), 50_000)
    assert [b.num_rows for b in first] == [b.num_rows for b in second]
    assert all(a.equals(b) for a, b in zip(first, second))


def test_engine_cuts_large_task_output_into_target_sized_blocks(ctx):
    ctx.target_max_block_size = 1 << 20

    def explode(row):  # each input row becomes 64 rows of 64 KiB: 4 MiB per row
        return [{"id": row["id"], "payload": bytes(65536)} for _ in range(64)]

    ds = sb.range(4, override_num_blocks=1).flat_map(explode)
    refs = list(ds.iter_internal_ref_bundles())
    assert sum(r.num_rows for r in refs) == 256
    assert all(r.size_bytes <= 1 << 20 for r in refs)
    assert len(refs) >= 16


def test_engine_replay_emits_identical_blocks(ctx):
    ctx.target_max_block_size = 200_000
    ds = sb.range(100_000, override_num_blocks=3).map_batches(lambda b: b.append_column("y", b["id"]),
                                                              batch_format="pyarrow")
    first = [(r.producer, r.num_rows) for r in ds.iter_internal_ref_bundles()]
    second = [(r.producer, r.num_rows) for r in ds.iter_internal_ref_bundles()]
    assert sorted(first) == sorted(second) and len(first) > 3


def test_small_blocks_are_coalesced_for_downstream_tasks(ctx):
    ctx.target_min_block_size = 64 * 1024
    ds = sb.range(20_000, override_num_blocks=40).map_batches(lambda b: b, num_cpus=2, batch_format="pyarrow")
    assert ds.count() == 20_000
    downstream = ds.last_run_stats.ops[1]
    assert downstream.tasks_done < 40  # 40 blocks of 4 KB were bundled into fewer tasks


def test_block_dirs_of_dead_drivers_are_swept_and_live_ones_kept(tmp_path):
    import socket
    import subprocess
    import sys

    from airflow_streambatch.engine.worker.blocks import OWNER_FILE, create_run_dir

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / "run-orphan"
    orphan.mkdir()
    (orphan / OWNER_FILE).write_text(f"{socket.gethostname()} {dead.stdout.strip()}")
    (orphan / "0-p00000-0.arrow").write_bytes(b"x" * 1000)
    foreign = tmp_path / "run-other-host"
    foreign.mkdir()
    (foreign / OWNER_FILE).write_text(f"some-other-host {dead.stdout.strip()}")
    mine = create_run_dir(str(tmp_path), "new")
    assert not orphan.exists() and foreign.exists()
    create_run_dir(str(tmp_path), "another")
    assert os.path.isdir(mine)  # this process is alive: its run directory stays
