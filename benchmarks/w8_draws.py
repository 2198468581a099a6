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
overlap, so optimum = phase A + phase B, each the largest of its bounds. Tasks are the
plan's units and are never split: a load task per input row (range(T) in T blocks), and
one repartition block's expand, or its inference, is a task of its own. So besides each
resource's slot-seconds over its slots, n tasks of at least d seconds on C slots take at
least ceil(n / C) d (some slot runs ceil(n / C) of them), and the first inference cannot
start before an expand task has yielded its first piece:

    before: A = max(T F / C, ceil(T / C) F)
            B = max(T R c / C, ceil(n / C) c b, c min(p, b) + T R k g / G, c ceil(T R / n) + g)
    after:  A = max(T (F + R c) / C, ceil(T / C) (F + R c))
            B = max(T R k g / G, ceil(n / G) g floor(T R k / n), g ceil(T R k / n))

(C, G: CPU and GPU slots; b = floor(T R / n), the rows of the smallest repartition block;
p = input rows per piece an expand yields.) Repartition tasks and all non-sleep work
count 0, so ratios are >= 1. Sweeps before this bound used the divisible bound alone
(``divisible_s``: slot-seconds over slots, and one task's path), which no schedule of
whole tasks can reach where n is not a multiple of the slots (#29: 7 blocks of 5.3 s
on 6 CPU slots take 10.6 s, not the 6.2 s it counted). T is still sized on the
divisible bound, so the seed draws the same list as before.

The sweep sets ``target_max_block_size`` to 2 MiB (so limits of 2-50 blocks are 4-100
MiB) and otherwise runs the engine's defaults.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from benchmarks.common import MiB

BLOCK = 2 * MiB  # target_max_block_size for the whole sweep
PIECE = 256 * 1024  # bytes per table a transform yields (streaming output)
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

    @property
    def piece_rows(self) -> int:
        """Input rows an expand turns into one yielded piece (`w8_shapes.expand`)."""
        return max(1, PIECE // (self.out_k * self.out_row))

    def optimum(self) -> dict:
        """Phase A and B bounds of whole tasks (module docstring), and the divisible bound."""
        t, r, c, f, g, n = self.tasks, self.rows, self.row_s, self.task_s, self.gpu_row_s, self.num_blocks
        cpus, gpus = self.cpus, self.gpus
        gpu = self.out_rows * g / gpus
        if self.repartition == "before":
            block = t * r // n  # rows of the smallest repartition block
            a = {"cpu": t * f / cpus, "tasks": math.ceil(t / cpus) * f}
            b = {"cpu": t * r * c / cpus, "tasks": math.ceil(n / cpus) * c * block,
                 "gpu": c * min(self.piece_rows, block) + gpu, "path": c * math.ceil(t * r / n) + g}
            divisible = max(t * f / cpus, f) + max(t * r * c / cpus, gpu, b["path"])
        else:
            a = {"cpu": t * (f + r * c) / cpus, "tasks": math.ceil(t / cpus) * (f + r * c)}
            b = {"gpu": gpu, "tasks": math.ceil(n / gpus) * g * (self.out_rows // n),
                 "path": g * math.ceil(self.out_rows / n)}
            divisible = max(a["cpu"], f + r * c) + max(gpu, b["path"])
        streaming = max(t * (f + r * c) / cpus, gpu)
        return {"s": max(a.values()) + max(b.values()), "phase_a": a, "phase_b": b, "divisible_s": divisible,
                "without_barrier_s": streaming}

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
        if shape.optimum()["divisible_s"] >= target:
            break
    else:
        return None
    if shape.optimum()["divisible_s"] > 1.5 * opt_range[1]:
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
