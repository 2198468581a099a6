"""No run blocks forever under a memory limit (issue 19), on real local Spark.

Tasks that wait for memory grants hold Spark slots; the consumer that would free the
memory must still get one (preemption, `StreamingExecutor._preempt`), and a limit
smaller than two blocks is handled before the run starts. ``stall_timeout_s`` bounds every wait for memory as a
backstop (each test sets it, so a regression fails loudly instead of hanging).
"""

from __future__ import annotations

import random
import time
from functools import partial

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as sb

KiB = 1024
BLOCK = 128 * KiB


def expand(batch, pad=2 * KiB):
    return batch.append_column("pad", pa.array([b"x" * pad] * batch.num_rows))


def tag(batch):
    return batch.append_column("tag", pa.array(["t"] * batch.num_rows))


def _inputs(folder, files=8, rows=100):
    folder.mkdir()
    for f in range(files):
        pq.write_table(pa.table({"id": list(range(f * rows, (f + 1) * rows))}), folder / f"part-{f}.parquet")


@pytest.mark.parametrize("policy", ["adaptive", "conservative"])
@pytest.mark.parametrize("blocks", [1, 2, 4, 8])
def test_a_tight_limit_finishes_with_every_row_once(ctx, tmp_path, policy, blocks):
    _inputs(tmp_path / "in")
    ctx.scheduling_policy = policy
    ctx.memory_limit = blocks * BLOCK
    ctx.target_max_block_size = BLOCK
    ctx.stall_timeout_s = 60  # a stall fails the test loudly instead of hanging it
    ds = (sb.read_parquet(str(tmp_path / "in"), override_num_blocks=8)
          .map_batches(expand, batch_format="pyarrow").map_batches(tag, num_cpus=0.5, batch_format="pyarrow"))
    started = time.monotonic()
    result = ds.write_parquet(str(tmp_path / "out"))
    peak = ds.last_run_stats.peak_memory_bytes
    print(f"{policy} limit {blocks} block(s): {time.monotonic() - started:.1f} s, peak buffered {peak} bytes "
          f"of {ctx.memory_limit} ({peak / ctx.memory_limit:.2f}x)")
    assert sorted(result.committed) == list(range(8))
    assert sorted(pq.read_table(str(tmp_path / "out"))["id"].to_pylist()) == list(range(800))


def _cost(batch, expansion, sleep_s):
    time.sleep(sleep_s)
    ids = batch.select(["id"])
    if expansion >= 1:
        return pa.concat_tables([expand(ids, 512)] * int(expansion))
    return expand(ids.slice(0, max(1, int(ids.num_rows * expansion))), 512)


def test_random_small_pipelines_never_block(ctx):
    seed = 19
    rng = random.Random(seed)
    print(f"seed {seed}")
    for case in range(6):
        ctx.scheduling_policy = rng.choice(["adaptive", "conservative"])
        ctx.target_max_block_size = 32 * KiB
        ctx.memory_limit = rng.randint(1, 8) * ctx.target_max_block_size
        ctx.stall_timeout_s = 60
        ds = sb.range(rng.randint(20, 200), override_num_blocks=rng.randint(2, 6))
        shape = []
        for _ in range(rng.randint(1, 3)):
            expansion = rng.choice([0.5, 1, 2, 4])
            cpus = rng.choice([1, 0.5, 0.25])
            sleep_s = rng.choice([0, 0.01, 0.05])
            shape.append((expansion, cpus, sleep_s))
            ds = ds.map_batches(partial(_cost, expansion=expansion, sleep_s=sleep_s), num_cpus=cpus,
                                batch_format="pyarrow")
        started = time.monotonic()
        rows = ds.count()
        elapsed = time.monotonic() - started
        print(f"case {case}: {ctx.scheduling_policy}, limit {ctx.memory_limit // KiB} KiB, ops {shape}: "
              f"{rows} rows in {elapsed:.1f} s")
        assert rows > 0 and elapsed < 120


def test_a_limit_below_two_blocks_cuts_smaller_blocks_and_says_so(ctx, caplog):
    ctx.memory_limit = 64 * KiB
    ctx.target_max_block_size = BLOCK
    with caplog.at_level("WARNING", logger="airflow_streambatch.engine.progress"):
        rows = sb.range(400, override_num_blocks=2).map_batches(partial(expand, pad=1 * KiB),
                                                                batch_format="pyarrow").take_all()
    assert len(rows) == 400
    assert "fewer than 2 blocks of DataContext.target_max_block_size" in caplog.text
    assert ctx.target_max_block_size == BLOCK  # only the run's copy changed
