"""W2: per-partition overhead (paper 5.3.2, figure 10), sleep-based.

Two stages over N rows of 256 KiB, 10 ms of work per row per stage, with the target
block size swept from one row to all rows. Reports throughput against block size,
efficiency (the analytic bound over the time taken) and the scheduling overhead per
task (Spark job wall time minus its busiest partition's work, over tasks), with group
scheduling (several tasks per Spark partition, and partitions that check in with the
driver for more: `execution/check_ins.py`) and without (one Spark job per task group,
each partition running its group and ending).

    python -m benchmarks.w2_overhead [--quick]
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from functools import partial

from benchmarks.common import engine_context, markdown_table, parse_args, save, spark_session, timed, warm_up

ROW_BYTES = 256 * 1024


@dataclass
class W2:
    rows: int = 512
    row_s: float = 0.01
    slots: int = 4
    rows_per_block: tuple = (1, 4, 16, 64, 128, 512)


QUICK = W2(rows=64, rows_per_block=(1, 8, 64))


def stage_one(batch, cfg: W2):
    import pyarrow as pa

    time.sleep(cfg.row_s * batch.num_rows)
    return pa.table({"id": batch["id"], "data": pa.array([bytes(ROW_BYTES)] * batch.num_rows, pa.binary())})


def stage_two(batch, cfg: W2):
    time.sleep(cfg.row_s * batch.num_rows)
    return batch.select(["id"])


def run(cfg: W2, rows_per_block: int, grouped: bool) -> dict:
    import airflow_streambatch.engine as sb

    block = rows_per_block * (ROW_BYTES + 64)
    engine_context(
        target_max_block_size=block, target_min_block_size=block, group_scheduling=grouped,
        resources={"CPU": cfg.slots}, enable_operator_fusion=False,
    )
    ds = (
        sb.range(cfg.rows, override_num_blocks=max(1, cfg.rows // rows_per_block))
        .map_batches(partial(stage_one, cfg=cfg), batch_format="pyarrow")
        .map_batches(partial(stage_two, cfg=cfg), batch_format="pyarrow")
    )
    wall, count = timed(ds.count)
    assert count == cfg.rows
    ops = ds.last_run_stats.ops
    tasks = sum(op.tasks_done for op in ops)
    overhead = sum(op.scheduling_overhead_s for op in ops)
    return {
        "rows_per_block": rows_per_block, "grouped": grouped, "time_s": wall, "rows_per_s": cfg.rows / wall,
        "tasks": tasks, "jobs": len(ds.last_run_stats.launch_log), "overhead_per_task_ms": 1000 * overhead / tasks,
        "ideal_s": ideal_s(cfg, rows_per_block),
    }


def ideal_s(cfg: W2, rows_per_block: int) -> float:
    """The analytic bound: the work over the slots, or one block through both stages, whichever
    is longer (a single block of all rows cannot run faster than its two stages in turn)."""
    return max(2 * cfg.rows * cfg.row_s / cfg.slots, 2 * min(rows_per_block, cfg.rows) * cfg.row_s)


def main() -> None:
    args = parse_args(__doc__)
    cfg = QUICK if args.quick else W2()
    spark_session(cfg.slots)
    warm_up(cfg.slots)
    runs = []
    for k in cfg.rows_per_block:
        for grouped in (True, False):
            r = run(cfg, k, grouped)
            runs.append(r)
            print(f"{k} rows/block grouped={grouped}: {r['rows_per_s']:.1f} rows/s, {r['jobs']} jobs, "
                  f"{r['overhead_per_task_ms']:.1f} ms overhead/task", flush=True)
    rows = [[r["rows_per_block"], f"{r['rows_per_block'] * ROW_BYTES // 1024} KiB", "on" if r["grouped"] else "off",
             r["tasks"], r["jobs"], f"{r['rows_per_s']:.1f}", f"{r['ideal_s'] / r['time_s']:.2f}",
             f"{r['overhead_per_task_ms']:.1f}"] for r in runs]
    table = (f"W2: {cfg.rows} rows of 256 KiB, two stages of {cfg.row_s * 1000:.0f} ms/row, {cfg.slots} slots; "
             f"the block size is the knob swept (`override_num_blocks` and the target block sizes)\n\n"
             + markdown_table(["rows/block", "block", "group scheduling", "tasks", "Spark jobs", "rows/s",
                               "efficiency (bound/actual)", "sched overhead/task (ms)"], rows))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for grouped in (True, False):
        sel = [r for r in runs if r["grouped"] == grouped]
        label = "group scheduling, partitions check in" if grouped else "one job per task group"
        xs = [r["rows_per_block"] for r in sel]
        left.plot(xs, [r["rows_per_s"] for r in sel], marker="o", label=label)
        right.plot(xs, [r["overhead_per_task_ms"] for r in sel], marker="o", label=label)
    for ax, ylabel in ((left, "throughput (rows/s)"), (right, "scheduling overhead per task (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rows per block (256 KiB each)")
        ax.set_ylabel(ylabel)
        ax.legend()
    right.axhline(10, color="grey", linewidth=0.8, linestyle=":")  # the target: 10 ms per task
    fig.suptitle("W2 per-partition overhead")
    save(args.out, "w2_overhead" + ("_quick" if args.quick else ""), {"config": asdict(cfg), "runs": runs}, table, fig)


if __name__ == "__main__":
    main()
