"""W8: workload shapes the engine was not tuned for (issue 16, item 5), sleep-based, real bytes.

Random 3-operator pipelines, each run under both policies in one Spark application:

    range(T) -> load (CPU: sleeps F per input task, yields R rows of ``in_row`` bytes)
             -> expand (CPU: sleeps c per input row, turns each row into ``k`` rows of
                ``out_row`` bytes, about E times its bytes, streamed out in pieces)
             -> infer (GPU slots, ``num_gpus=1``: sleeps g per row)

with ``repartition(n)`` (a barrier: it waits for all its input) before or after
``expand``. Before: [read->load] | repartition | expand | infer; after: [read->load->expand]
(fused, same resources) | repartition | infer.

What is drawn, and each pipeline's analytic optimum (a lower bound): `benchmarks/w8_draws.py`.
docs/benchmarks.md (W8) has the full description and the measured sweep.

    python -m benchmarks.w8_shapes [--quick] [--seed N] [--shapes N] [--only 3,7]
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from dataclasses import asdict
from functools import partial

from benchmarks.common import MiB, engine_context, markdown_table, parse_args, save, spark_session, warm_up
from benchmarks.w8_draws import BLOCK, PIECE, Shape, draw_shapes

SEED = 16
FAIL_AT = 10.0  # where the plot draws a run that failed or hung


# -- the workload's operators (module-level so Spark workers import them) ----------
def _table(rows: int, size: int):
    import numpy as np
    import pyarrow as pa

    offsets = pa.py_buffer(np.arange(0, (rows + 1) * size, size, dtype=np.int64))
    data = pa.py_buffer(np.zeros(rows * size, dtype=np.uint8))
    return pa.table({"payload": pa.Array.from_buffers(pa.large_binary(), rows, [None, offsets, data])})


def load(batch, shape: Shape):
    for _ in range(batch.num_rows):
        time.sleep(shape.task_s)
        step = max(1, PIECE // shape.in_row)
        for start in range(0, shape.rows, step):
            yield _table(min(step, shape.rows - start), shape.in_row)


def expand(batch, shape: Shape):
    per_row = shape.out_k * shape.out_row
    step = max(1, PIECE // per_row)  # input rows per piece
    for start in range(0, batch.num_rows, step):
        rows_in = min(step, batch.num_rows - start)
        time.sleep(shape.row_s * rows_in)
        rows_out, per_piece = rows_in * shape.out_k, max(1, PIECE // shape.out_row)
        for first in range(0, rows_out, per_piece):
            yield _table(min(per_piece, rows_out - first), shape.out_row)


def infer(batch, shape: Shape):
    import pyarrow as pa

    time.sleep(shape.gpu_row_s * batch.num_rows)
    return pa.table({"n": [batch.num_rows]})


class _Warnings(logging.Handler):
    """The engine's warnings during one run (e.g. its guard writing a block over the limit)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:200])


def _sleeps(shape: Shape) -> list[float]:
    """Sleep seconds per physical operator (repartition: none), as the optimum counts them."""
    t, r, c, f = shape.tasks, shape.rows, shape.row_s, shape.task_s
    infer_s = shape.out_rows * shape.gpu_row_s
    if shape.repartition == "before":
        return [t * f, 0.0, t * r * c, infer_s]
    return [t * (f + r * c), 0.0, infer_s]


def _snapshot(executor) -> str:
    """What a run that stopped moving holds: every operator's queue, running tasks and slots."""
    mem = executor.memory
    lines = [f"memory used {mem.used} reserved {mem.reserved:.0f} limit {mem.limit}"]
    for op in executor.operators:
        extra = ""
        if hasattr(op, "groups"):
            extra = f", {len(op.groups)} groups, {len(op.barrier_blocks)} barrier blocks"
        lines.append(f"{op.name}: running {op.running_tasks}, inputs {len(op.inputs)}, upstream_done "
                     f"{op.upstream_done}, done {op.done}, has_input {op.has_input()}, usable_slots "
                     f"{op.usable_slots()}, buffered {op.buffered_output_bytes}, tasks done {op.stats.tasks_done}"
                     + extra)
    return "; ".join(lines)


def _consume(ds, timeout_s: float):
    """Run ``ds`` and count the rows ``infer`` saw (it returns one row per batch: its row count).
    A run with no output and no end for ``timeout_s`` is stopped and reported as hung, with
    a snapshot of its state: the engine fails a stall of tasks waiting for memory itself
    (``stall_timeout_s``) but not a scheduler that launches nothing."""
    import queue

    from airflow_streambatch.engine.execution.executor import DONE

    executor = ds._start()
    rows, failure, deadline = 0, None, time.monotonic() + timeout_s
    try:
        while True:
            try:
                item = executor.outputs.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                failure = f"hung after {timeout_s:.0f} s: " + _snapshot(executor)
                executor.shutdown()
                break
            if item is DONE:
                break
            if isinstance(item, BaseException):
                failure = f"{type(item).__name__}: {str(item)[:600]}"
                break
            rows += sum(executor.read_output(item).column("n").to_pylist())
            executor.release(item)
    finally:
        executor.join()
        executor.cleanup()
    return rows, executor.stats, failure


def run(shape: Shape, policy: str) -> dict:
    import airflow_streambatch.engine as sb

    engine_context(memory_limit=shape.limit, scheduling_policy=policy, target_max_block_size=BLOCK,
                   resources={"CPU": shape.cpus, "GPU": shape.gpus})
    ds = sb.range(shape.tasks).map_batches(
        partial(load, shape=shape), batch_format="pyarrow")
    exp = partial(expand, shape=shape)
    if shape.repartition == "before":
        ds = ds.repartition(shape.num_blocks).map_batches(exp, batch_format="pyarrow")
    else:
        ds = ds.map_batches(exp, batch_format="pyarrow").repartition(shape.num_blocks)
    ds = ds.map_batches(partial(infer, shape=shape), num_gpus=1, batch_format="pyarrow")
    warnings, logger = _Warnings(), logging.getLogger("airflow_streambatch")
    logger.addHandler(warnings)
    start = time.perf_counter()
    try:
        rows, stats, failure = _consume(ds, timeout_s=30 + 6 * shape.optimum()["s"])
    finally:
        logger.removeHandler(warnings)
    wall = time.perf_counter() - start
    if failure is None:
        assert rows == shape.out_rows, (rows, shape.out_rows)
    ops = [{"name": op.name, "tasks": op.tasks_done, "blocks_out": op.blocks_out, "rows_out": op.rows_out,
            "bytes_out": op.bytes_out, "wall_s": round(op.wall_s, 3), "work_s": round(op.work_s, 3),
            "overhead_per_task_s": round(op.overhead_per_task_s, 4), "sleep_s": round(sleep, 3)}
           for op, sleep in zip(stats.ops, _sleeps(shape))]
    for up, op in zip(ops, ops[1:]):
        op["blocks_in_per_task"] = round(up["blocks_out"] / op["tasks"], 2) if op["tasks"] else None
    ratio = math.inf if failure else wall / shape.optimum()["s"]
    return {"time_s": wall, "ratio": ratio, "failed": failure, "peak_bytes": stats.peak_memory_bytes,
            "peak_over_limit": stats.peak_memory_bytes / shape.limit, "spark_jobs": len(stats.launch_log),
            "warnings": warnings.messages, "ops": ops, "stats": stats.summary()}


def _x(ratio: float) -> str:
    return "fails" if math.isinf(ratio) else f"{ratio:.2f}x"


def _cell(run: dict) -> str:
    return ("hung" if run["failed"].startswith("hung") else "fails") if run["failed"] else f"{run['ratio']:.2f}x"


def plot(results: list[dict], out: str, name: str, table: str, figures: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for policy, marker in (("adaptive", "o"), ("conservative", "s")):
        ys = sorted(min(r[policy]["ratio"], FAIL_AT) for r in results)
        left.plot(range(1, len(ys) + 1), ys, marker=marker, markersize=4, label=policy)
    for y, style in ((1.15, "--"), (1.3, ":")):
        left.axhline(y, color="grey", linestyle=style, linewidth=1, label=f"target {y}x")
    left.set_xlabel(f"pipelines, sorted (failed or hung runs drawn at {FAIL_AT:.0f}x)")
    left.set_ylabel("time / analytic optimum (lower bound)")
    left.set_yscale("log")
    left.set_title("completion time / optimum")
    left.legend(fontsize=8)
    peaks = [r["conservative"]["peak_over_limit"] for r in results]
    right.bar(range(len(peaks)), peaks, color=["red" if p > 1 else "tab:orange" for p in peaks])
    right.axhline(1.0, color="red", linewidth=1, label="memory limit")
    right.set_xlabel("pipeline #")
    right.set_ylabel("peak buffered / limit")
    right.set_title("conservative: peak memory against its limit")
    right.legend(fontsize=8)
    fig.suptitle("W8 workload shapes")
    save(out, name, figures, table, fig)


def main() -> None:
    args = parse_args(__doc__, {
        "--seed": {"type": int, "default": SEED, "help": "seed of the drawn pipelines"},
        "--shapes": {"type": int, "default": None, "help": "how many pipelines (default 30, quick 4)"},
        "--only": {"default": "", "help": "comma-separated pipeline numbers to run (of the drawn list)"}})
    count = args.shapes or (4 if args.quick else 30)
    opt_range = (0.5, 1.0) if args.quick else (3.0, 6.0)
    shapes, redraws = draw_shapes(args.seed, count, opt_range)
    if args.only:
        keep = {int(i) for i in args.only.split(",")}
        shapes = [s for s in shapes if s.index in keep]
    print(f"W8: seed {args.seed}, {len(shapes)} pipelines ({redraws} draws redrawn), optimum target "
          f"{opt_range[0]}-{opt_range[1]} s", flush=True)
    slots = max(s.cpus + s.gpus for s in shapes) + 2
    spark_session(slots)
    warm_up(slots)
    start = time.perf_counter()
    results, rows = [], []
    for shape in shapes:
        opt = shape.optimum()
        entry = {"shape": asdict(shape), "optimum": opt}
        for policy in ("adaptive", "conservative"):
            entry[policy] = run(shape, policy)
        results.append(entry)
        a, c = entry["adaptive"], entry["conservative"]
        flag = " OVER" if c["peak_over_limit"] > 1 else ""
        rows.append([shape.index, f"{shape.tasks}x{shape.rows}", f"{shape.expansion:.3g}x", f"{shape.in_row} B",
                     f"{shape.row_s * 1000:.0f}", f"{shape.task_s:.2f}", f"{shape.cpus}:{shape.gpus}",
                     shape.limit_blocks, f"{shape.repartition}[{shape.num_blocks}]",
                     f"{shape.loaded_bytes / MiB:.2f} / {shape.expanded_bytes / MiB:.2f}", f"{opt['s']:.2f}",
                     _cell(a), _cell(c), f"{c['peak_over_limit']:.2f}{flag}"])
        print(f"#{shape.index} {shape.label()}: optimum {opt['s']:.2f} s, adaptive {_cell(a)}, "
              f"conservative {_cell(c)}, conservative peak/limit {c['peak_over_limit']:.2f}{flag}", flush=True)
        for policy in ("adaptive", "conservative"):
            if entry[policy]["failed"]:
                print(f"   {policy}: {entry[policy]['failed']}", flush=True)
    wall = time.perf_counter() - start
    summary = {}
    for policy in ("adaptive", "conservative"):
        ratios = [r[policy]["ratio"] for r in results]
        divisible = [r[policy]["time_s"] / r["optimum"]["divisible_s"] for r in results]
        summary[policy] = {"worst": max(ratios), "median": statistics.median(ratios),
                           "failed": sum(r[policy]["failed"] is not None for r in results),
                           "divisible_worst": max(divisible), "divisible_median": statistics.median(divisible)}
    over = sum(r["conservative"]["peak_over_limit"] > 1 for r in results)
    line = "; ".join(f"{p}: worst {_x(v['worst'])}, median {_x(v['median'])}, {v['failed']} failed or hung"
                     for p, v in summary.items())
    line += (f"; conservative above its limit in {over} of {len(results)} "
             f"(targets: worst <= 1.3x, median <= 1.15x, never above); sweep wall {wall:.0f} s\n\n"
             "Against the divisible bound of earlier sweeps (`w8_draws.py`): "
             + "; ".join(f"{p} worst {_x(v['divisible_worst'])}, median {_x(v['divisible_median'])}"
                         for p, v in summary.items()))
    headers = ["#", "T x R", "E", "in row", "c ms/row", "F s/task", "CPU:GPU", "limit (blocks)", "repartition",
               "loaded / expanded MiB", "optimum s", "adaptive", "conservative", "cons. peak / limit"]
    table = (f"W8: {len(results)} random pipelines (seed {args.seed}), time / analytic optimum (a lower bound); "
             f"blocks of {BLOCK // MiB} MiB (target_max_block_size), engine defaults otherwise\n\n"
             + markdown_table(headers, rows) + "\n\n" + line)
    worst = sorted(((r[p]["ratio"], p, r) for r in results for p in ("adaptive", "conservative")),
                   key=lambda x: -x[0])[:4]
    detail = "\n\n".join(f"#{r['shape']['index']} {p} {_x(ratio)} (optimum {r['optimum']['s']:.2f} s: "
                         f"A {r['optimum']['phase_a']}, B {r['optimum']['phase_b']})\n{r[p]['stats']}"
                         for ratio, p, r in worst)
    figures = {"seed": args.seed, "opt_range_s": opt_range, "redraws": redraws, "block_bytes": BLOCK,
               "summary": summary, "above_limit": over, "wall_s": wall, "pipelines": results}
    plot(results, args.out, "w8_shapes" + ("_quick" if args.quick else ""),
         table + "\n\nSlowest runs, `ds.stats()`:\n\n" + detail, figures)


if __name__ == "__main__":
    main()
