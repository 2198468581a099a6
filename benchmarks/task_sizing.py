"""Task sizing by cost (issue 16, item 1): how many input blocks a map task takes.

Two shapes, each run with the engine's defaults and with one block per task (the
baseline, forced with ``target_min_block_size=1``: no block is then small enough to
bundle):

* **expanding** (the pattern of a table of file paths feeding a decoder and a model):
  ``paths`` one-row inputs, spread with ``repartition``, each loaded in ``load_s`` into
  ``rows_out`` rows of 1 MiB, then an inference stage on GPU slots (``batch_s`` per
  batch of 20 rows). Bundling these 8-byte blocks by input bytes put ~5 slow rows in
  each task, serially, on a few slots.
* **cheap**: ``blocks`` one-row blocks (materialized before the clock starts) through
  two maps of ``row_s`` per row, where one block per task pays a task's overhead per
  millisecond of work.

The optimum is the analytic bound max(slot-seconds per resource / its slots); for
the cheap shape it is the work alone, which no engine with per-task overhead reaches.

    python -m benchmarks.task_sizing [--quick]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial

from benchmarks.common import MiB, engine_context, markdown_table, parse_args, save, spark_session, warm_up

CPUS, GPUS = 4, 2


@dataclass
class Expanding:
    paths: int = 48
    load_s: float = 1.0
    rows_out: int = 32
    batch_s: float = 0.1
    memory_limit_mib: int = 256

    @property
    def optimum_s(self) -> float:
        return max(self.paths * self.load_s / CPUS, self.paths * self.rows_out / 20 * self.batch_s / GPUS)


@dataclass
class Cheap:
    blocks: int = 1024
    row_s: float = 0.001

    @property
    def optimum_s(self) -> float:
        return 1.5 * self.blocks * self.row_s / CPUS  # CPU-seconds: the second map holds half a CPU


QUICK = (Expanding(paths=12, load_s=0.5, rows_out=8), Cheap(blocks=256))


def load(batch, cfg: Expanding):
    import pyarrow as pa

    time.sleep(cfg.load_s * batch.num_rows)
    ids = [i for i in batch["id"].to_pylist() for _ in range(cfg.rows_out)]
    return pa.table({"id": ids, "data": pa.array([bytes(MiB)] * len(ids), pa.binary())})


def infer(batch, cfg: Expanding):
    time.sleep(cfg.batch_s)
    return batch.select(["id"])


def cheap_map(batch, row_s: float):
    time.sleep(row_s * batch.num_rows)
    return batch


def run_expanding(cfg: Expanding, one_per_task: bool) -> dict:
    import airflow_streambatch.engine as sb

    knobs = {"target_min_block_size": 1} if one_per_task else {}
    engine_context(resources={"CPU": CPUS, "GPU": GPUS}, memory_limit=cfg.memory_limit_mib * MiB, **knobs)
    ds = (sb.range(cfg.paths).repartition(cfg.paths)
          .map_batches(partial(load, cfg=cfg), batch_format="pyarrow")
          .map_batches(partial(infer, cfg=cfg), batch_size=20, num_gpus=1, batch_format="pyarrow"))
    start = time.perf_counter()
    rows = ds.count()
    wall = time.perf_counter() - start
    assert rows == cfg.paths * cfg.rows_out
    return _figures(ds, wall, cfg.optimum_s)


def run_cheap(cfg: Cheap, one_per_task: bool) -> dict:
    import airflow_streambatch.engine as sb

    knobs = {"target_min_block_size": 1} if one_per_task else {}
    engine_context(resources={"CPU": CPUS}, **knobs)
    source = sb.range(cfg.blocks, override_num_blocks=cfg.blocks).materialize()  # blocks exist: no read tasks
    ds = (source.map_batches(partial(cheap_map, row_s=cfg.row_s), batch_format="pyarrow")
          .map_batches(partial(cheap_map, row_s=cfg.row_s), num_cpus=0.5, batch_format="pyarrow"))
    start = time.perf_counter()
    rows = ds.count()
    wall = time.perf_counter() - start
    assert rows == cfg.blocks
    return _figures(ds, wall, cfg.optimum_s)


def _figures(ds, wall: float, optimum_s: float) -> dict:
    stats = ds.last_run_stats
    return {"wall_s": wall, "ratio": wall / optimum_s,
            "tasks": {op.name: op.tasks_done for op in stats.ops}, "peak_bytes": stats.peak_memory_bytes}


def main() -> None:
    args = parse_args(__doc__)
    shapes = QUICK if args.quick else (Expanding(), Cheap())
    spark_session(CPUS + GPUS)
    warm_up(CPUS + GPUS)
    repeats = 1 if args.quick else 3
    runners = {"expanding": run_expanding, "cheap": run_cheap}
    names = list(runners)
    results = {name: {"default": [], "one block per task": []} for name in names}
    for _ in range(repeats):  # interleaved: drift on the machine hits both alike
        for name, cfg in zip(names, shapes):
            results[name]["default"].append(runners[name](cfg, one_per_task=False))
            results[name]["one block per task"].append(runners[name](cfg, one_per_task=True))

    def median(name: str, mode: str) -> dict:
        runs = results[name][mode]
        return min(runs, key=lambda r: abs(r["wall_s"] - statistics.median(x["wall_s"] for x in runs)))

    rows = []
    for name, cfg in zip(names, shapes):
        base = median(name, "one block per task")
        for mode in ("default", "one block per task"):
            r = median(name, mode)
            tasks = ", ".join(f"{op}: {n}" for op, n in r["tasks"].items())
            rows.append([name, mode, f"{cfg.optimum_s:.1f}", f"{r['wall_s']:.1f}", f"{r['ratio']:.2f}x",
                         f"{r['wall_s'] / base['wall_s']:.2f}x", tasks])
    table = (f"Task sizing: default (by cost) vs one block per task (`target_min_block_size=1`, the baseline), "
             f"{CPUS} CPU + {GPUS} GPU slots, median of {repeats} interleaved runs\n\n"
             + markdown_table(["shape", "sizing", "optimum (s)", "time (s)", "vs optimum", "vs one per task",
                               "tasks per operator"], rows))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    x = range(len(names))
    for offset, mode in ((-0.2, "default"), (0.2, "one block per task")):
        ax.bar([i + offset for i in x], [median(n, mode)["ratio"] for n in names], width=0.4, label=mode)
    ax.axhline(1.3, color="gray", linestyle="--", linewidth=1)
    ax.set_xticks(list(x), names)
    ax.set_ylabel("time / analytic optimum")
    ax.set_title("Task sizing by cost")
    ax.legend()
    figures = {"shapes": {n: asdict(c) for n, c in zip(names, shapes)}, "results": results}
    save(args.out, "task_sizing" + ("_quick" if args.quick else ""), figures, table, fig)


if __name__ == "__main__":
    main()
