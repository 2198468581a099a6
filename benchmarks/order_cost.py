"""The cost of ``preserve_order`` (issue 16, item 4): the same pipelines with the option off
(the default, as in Ray Data) and on, interleaved, with default engine settings.

Three shapes, on 4 simulated CPU slots:

* **uniform**: 48 input blocks, a 0.2 s map then a 0.1 s map per block;
* **skewed**: the same, but each block's first map takes 0.02-0.6 s (seeded): early
  blocks that run long hold every later block back in the driver;
* **tiny**: 256 one-row blocks through a cheap map (W2's shape), where ordering stops
  bundling blocks of different read tasks into one task.

For each: time to the last row, time to the first row, and the run's peak of buffered
block bytes (`RunStats.peak_memory_bytes`).

    python -m benchmarks.order_cost [--quick]
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial

from benchmarks.common import engine_context, markdown_table, parse_args, save, spark_session, warm_up


@dataclass
class Shape:
    name: str
    blocks: int
    first_s: tuple[float, float]  # the first map's time per block: uniform between these
    second_s: float


SHAPES = [Shape("uniform", 48, (0.2, 0.2), 0.1), Shape("skewed", 48, (0.02, 0.6), 0.1), Shape("tiny", 256, (0, 0), 0)]
QUICK = [Shape("uniform", 16, (0.1, 0.1), 0.05), Shape("skewed", 16, (0.02, 0.3), 0.05),
         Shape("tiny", 64, (0, 0), 0)]
SLOTS = 4


def first_map(batch, seconds: dict):
    time.sleep(seconds.get(int(batch["id"][0]), 0.0))
    return batch


def second_map(batch, seconds: float):
    time.sleep(seconds)
    return batch


def run(shape: Shape, ordered: bool) -> dict:
    import airflow_streambatch.engine as sb

    ctx = engine_context(resources={"CPU": SLOTS})
    ctx.execution_options.preserve_order = ordered
    rng = random.Random(7)  # the same task times with and without ordering
    seconds = {i: rng.uniform(*shape.first_s) for i in range(shape.blocks)}
    ds = (sb.range(shape.blocks, override_num_blocks=shape.blocks)
          .map_batches(partial(first_map, seconds=seconds), batch_format="pyarrow")
          .map_batches(partial(second_map, seconds=shape.second_s), num_cpus=0.5, batch_format="pyarrow"))
    start = time.perf_counter()
    first_row_s, ids = None, []
    for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
        first_row_s = first_row_s if first_row_s is not None else time.perf_counter() - start
        ids.extend(batch["id"].to_pylist())
    total_s = time.perf_counter() - start
    assert sorted(ids) == list(range(shape.blocks)) and (not ordered or ids == sorted(ids))
    return {"total_s": total_s, "first_row_s": first_row_s, "peak_bytes": ds.last_run_stats.peak_memory_bytes}


def main() -> None:
    args = parse_args(__doc__)
    shapes = QUICK if args.quick else SHAPES
    spark_session(SLOTS)
    warm_up(SLOTS)
    repeats = 1 if args.quick else 3
    results: dict[str, dict[str, list[dict]]] = {s.name: {"off": [], "on": []} for s in shapes}
    for _ in range(repeats):  # interleaved, so drift on the machine hits both alike
        for shape in shapes:
            results[shape.name]["off"].append(run(shape, ordered=False))
            results[shape.name]["on"].append(run(shape, ordered=True))

    def median(shape: str, mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[shape][mode])

    rows = []
    for shape in shapes:
        off, on = (median(shape.name, m, "total_s") for m in ("off", "on"))
        rows.append([shape.name, shape.blocks, f"{off:.2f}", f"{on:.2f}", f"{on / off:.2f}x"]
                    + [f"{median(shape.name, m, 'first_row_s'):.2f}" for m in ("off", "on")]
                    + [f"{median(shape.name, m, 'peak_bytes'):,.0f}" for m in ("off", "on")])
    table = (f"preserve_order off (default) vs on, {SLOTS} CPU slots, default engine settings; each shape's "
             f"block count set by `override_num_blocks` (the shape, e.g. 256 one-row blocks), median of {repeats} "
             "interleaved runs\n\n"
             + markdown_table(["shape", "blocks", "off: total (s)", "on: total (s)", "on / off", "off: first row (s)",
                               "on: first row (s)", "off: peak buffered (bytes)", "on: peak buffered (bytes)"], rows))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [s.name for s in shapes]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [median(n, "off", "total_s") for n in names], width=0.4, label="off (default)")
    ax.bar([i + 0.2 for i in x], [median(n, "on", "total_s") for n in names], width=0.4, label="preserve_order")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("time to the last row (s)")
    ax.set_title("The cost of preserve_order")
    ax.legend()
    figures = {"shapes": [asdict(s) for s in shapes], "slots": SLOTS, "results": results}
    save(args.out, "order_cost" + ("_quick" if args.quick else ""), figures, table, fig)


if __name__ == "__main__":
    main()
