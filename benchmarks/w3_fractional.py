"""W3: fractional parallelism (paper appendix A.1), sleep-based.

Two unfused stages of 1 s and 2 s per task on 8 CPU slots. The adaptive scheduler
gives each stage whatever slots it needs from moment to moment; the static split
pins 4 slots to each stage (``concurrency=4``), as a per-stage cluster would.

    python -m benchmarks.w3_fractional [--quick]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial

from benchmarks.common import engine_context, markdown_table, parse_args, save, spark_session, timed, warm_up


@dataclass
class W3:
    tasks: int = 32
    stage1_s: float = 1.0
    stage2_s: float = 2.0
    slots: int = 8

    @property
    def optimum_s(self) -> float:
        return self.tasks * (self.stage1_s + self.stage2_s) / self.slots


QUICK = W3(tasks=16, stage1_s=0.25, stage2_s=0.5)


def sleep_stage(batch, seconds: float):
    time.sleep(seconds)
    return batch


def run(cfg: W3, static_split: bool) -> dict:
    import airflow_streambatch.engine as sb

    engine_context(resources={"CPU": cfg.slots}, enable_operator_fusion=False)
    cap = cfg.slots // 2 if static_split else None
    ds = (
        sb.range(cfg.tasks)
        .map_batches(partial(sleep_stage, seconds=cfg.stage1_s), concurrency=cap, batch_format="pyarrow")
        .map_batches(partial(sleep_stage, seconds=cfg.stage2_s), concurrency=cap, batch_format="pyarrow")
    )
    wall, count = timed(ds.count)
    assert count == cfg.tasks
    return {"time_s": wall}


def main() -> None:
    args = parse_args(__doc__)
    cfg = QUICK if args.quick else W3()
    spark_session(cfg.slots)
    warm_up(cfg.slots)
    repeats = 1 if args.quick else 3
    runs = {"static": [], "adaptive": []}
    for _ in range(repeats):  # interleaved, so drift on the machine hits both alike
        runs["static"].append(run(cfg, static_split=True)["time_s"])
        runs["adaptive"].append(run(cfg, static_split=False)["time_s"])
    static = {"time_s": statistics.median(runs["static"])}
    dynamic = {"time_s": statistics.median(runs["adaptive"])}
    faster = 1 - dynamic["time_s"] / static["time_s"]
    table = (
        f"W3: {cfg.tasks} tasks, stages of {cfg.stage1_s} s and {cfg.stage2_s} s, {cfg.slots} CPU slots "
        f"(optimum {cfg.optimum_s:.1f} s), median of {repeats} interleaved runs\n\n"
        + markdown_table(
            ["schedule", "time (s)", "time / optimum"],
            [["static 4-4 split", f"{static['time_s']:.2f}", f"{static['time_s'] / cfg.optimum_s:.2f}x"],
             ["ours adaptive (fractional)", f"{dynamic['time_s']:.2f}", f"{dynamic['time_s'] / cfg.optimum_s:.2f}x"]]
        )
        + f"\n\nadaptive is {faster:.0%} faster than the static split (paper: 19%)"
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(["static 4-4", "adaptive", "optimum"], [static["time_s"], dynamic["time_s"], cfg.optimum_s],
           color=["tab:orange", "tab:blue", "grey"])
    ax.set_ylabel("job completion time (s)")
    ax.set_title("W3 fractional parallelism")
    figures = {"config": asdict(cfg), "static_s": static["time_s"], "adaptive_s": dynamic["time_s"],
               "optimum_s": cfg.optimum_s, "adaptive_faster_by": faster, "runs": runs}
    save(args.out, "w3_fractional" + ("_quick" if args.quick else ""), figures, table, fig)


if __name__ == "__main__":
    main()
