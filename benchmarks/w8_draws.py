"""W8's pipelines: what is drawn, how each is sized, and its analytic optimum.

Drawn per pipeline (seeded; the list is saved in the JSON, ``--seed`` redraws it): R
log-uniform 1-1000; E log-uniform 0.001x-100,000x; c 0-50 ms; F 0-2 s; CPU:GPU slots r:1
(r 1-8) or 2r:2 (r 1-4); a limit of 2-50 target blocks (log-uniform); n / CPU slots
0.5-8; GPU work = 0.25-2 x CPU work per slot. The input row size (64 B-64 KiB) is
lowered so neither data volume passes 160 MiB and the data at the barrier fits in half
the limit (else no scheduler could stay under it); T is the smallest count, at least 2
per CPU slot, whose optimum reaches a target drawn in ``opt_range`` (3-6 s, ``--quick``
0.5-1 s). Shapes that cannot be sized so are redrawn (counted in the JSON).

Analytic optimum: a lower bound. The barrier splits the run in two phases that cannot
overlap, so optimum = phase A + phase B, each the largest of its resource bounds
(sleep slot-seconds of the class / slots of the class) and its critical path:

    before: A = max(T F / C, F)
            B = max(T R c / C, T R k g / G, c ceil(T R / n) + g)
    after:  A = max(T (F + R c) / C, F + R c)
            B = max(T R k g / G, g ceil(T R k / n))

(C, G: CPU and GPU slots; a repartition block is never split, so one block's expand, or
its inference, is a task of its own.) Repartition tasks and all non-sleep work count 0,
so ratios are >= 1. The sweep sets ``target_max_block_size`` to 2 MiB (so limits of
2-50 blocks are 4-100 MiB) and otherwise runs the engine's defaults.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from benchmarks.common import MiB

BLOCK = 2 * MiB  # target_max_block_size for the whole sweep
ROW_CAP = 64 * 1024  # largest expanded row: bigger expansions make more rows
CAP_TOTAL = 160 * MiB  # loaded and expanded data per run
MAX_TASKS = 400


@dataclass
class Shape:
    index: int
    rows: int  # R, per input task
    expansion: float  # E drawn
    row_s: float  # c, expand, per input row
    task_s: float  # F, load, per input task
    cpus: int
    gpus: int
    limit_blocks: int
    repartition: str  # "before" or "after" expand
    num_blocks: int  # n
    gpu_beta: float
    tasks: int = 0  # T
    in_row: int = 0
    out_row: int = 0
    out_k: int = 1
    gpu_row_s: float = 0.0  # g

    @property
    def limit(self) -> int:
        return self.limit_blocks * BLOCK

    @property
    def loaded_bytes(self) -> int:
        return self.tasks * self.rows * self.in_row

    @property
    def expanded_bytes(self) -> int:
        return self.tasks * self.rows * self.out_k * self.out_row

    @property
    def out_rows(self) -> int:
        return self.tasks * self.rows * self.out_k

    def optimum(self) -> dict:
        t, r, c, f, g, n = self.tasks, self.rows, self.row_s, self.task_s, self.gpu_row_s, self.num_blocks
        gpu = self.out_rows * g / self.gpus
        if self.repartition == "before":
            a = {"cpu": t * f / self.cpus, "path": f}
            b = {"cpu": t * r * c / self.cpus, "gpu": gpu, "path": c * math.ceil(t * r / n) + g}
        else:
            a = {"cpu": t * (f + r * c) / self.cpus, "path": f + r * c}
            b = {"gpu": gpu, "path": g * math.ceil(self.out_rows / n)}
        streaming = max(t * (f + r * c) / self.cpus, gpu)
        return {"s": max(a.values()) + max(b.values()), "phase_a": a, "phase_b": b, "without_barrier_s": streaming}

    def label(self) -> str:
        return (f"{self.tasks}x{self.rows} rows, {self.expansion:.3g}x, {self.row_s * 1000:.0f} ms/row, "
                f"{self.task_s:.2f} s/task, {self.cpus}:{self.gpus}, {self.limit_blocks} blk, "
                f"rep {self.repartition}[{self.num_blocks}]")


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _size(shape: Shape, in_row: int) -> None:
    """Rows out per input row (k) and their size, about E x in_row bytes in all."""
    total = in_row * shape.expansion
    if shape.expansion >= 1:
        shape.out_k = max(1, math.ceil(total / ROW_CAP))
        shape.out_row = max(1, round(total / shape.out_k))
    else:
        shape.out_k, shape.out_row = 1, max(1, round(total))
    shape.in_row = in_row


def draw(rng: random.Random, index: int, opt_range: tuple[float, float]) -> Shape | None:
    """One shape, or None when it cannot be sized (the caller redraws)."""
    ratio = rng.randint(1, 8)
    gpus = 1 if ratio > 4 else rng.choice((1, 2))
    cpus = ratio * gpus
    shape = Shape(index=index, rows=round(_log_uniform(rng, 1, 1000)), expansion=10 ** rng.uniform(-3, 5),
                  row_s=rng.uniform(0, 0.05), task_s=rng.uniform(0, 2), cpus=cpus, gpus=gpus,
                  limit_blocks=round(_log_uniform(rng, 2, 50)), repartition=rng.choice(("before", "after")),
                  num_blocks=max(1, round(_log_uniform(rng, 0.5, 8) * cpus)), gpu_beta=_log_uniform(rng, 0.25, 2))
    in_row, target = round(_log_uniform(rng, 64, 64 * 1024)), rng.uniform(*opt_range)
    cpu_task = shape.task_s + shape.rows * shape.row_s  # CPU seconds per input task
    if cpu_task <= 0:
        return None
    gpu_task = shape.gpu_beta * cpu_task * gpus / cpus  # GPU seconds per input task
    _size(shape, 1)
    shape.gpu_row_s = gpu_task / (shape.rows * shape.out_k)  # refined once k is known
    for tasks in range(2 * cpus, MAX_TASKS + 1):
        shape.tasks = tasks
        if shape.optimum()["s"] >= target:
            break
    else:
        return None
    if shape.optimum()["s"] > 1.5 * opt_range[1]:
        return None
    shape.num_blocks = min(shape.num_blocks, shape.tasks * shape.rows)
    # the largest input row that keeps both data volumes under CAP_TOTAL and the barrier in half the limit
    rows_in = shape.tasks * shape.rows
    most = min(CAP_TOTAL / rows_in, CAP_TOTAL / (rows_in * shape.expansion),
               shape.limit / 2 / (rows_in * (1 if shape.repartition == "before" else shape.expansion)))
    in_row = min(in_row, math.floor(most))
    if in_row < 1 or (shape.expansion < 1 and in_row * shape.expansion < 1):
        return None
    _size(shape, in_row)
    shape.gpu_row_s = gpu_task / (shape.rows * shape.out_k)
    return shape


def draw_shapes(seed: int, count: int, opt_range: tuple[float, float]) -> tuple[list[Shape], int]:
    rng = random.Random(seed)
    shapes, redraws = [], 0
    while len(shapes) < count:
        shape = draw(rng, len(shapes), opt_range)
        if shape is None:
            redraws += 1
        else:
            shapes.append(shape)
    return shapes, redraws
