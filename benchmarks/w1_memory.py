"""W1: memory-aware scheduling (paper 5.3.1, figure 9), sleep-based.

Load (CPU): T tasks, each yields R rows of 1 MiB after ``load_s``;
Transform (CPU): ``row_s`` per row, returns a different 1 MiB row;
Inference (GPU slots): ``batch_s`` per batch of B rows.
Compares our two policies at several memory limits with plain-Spark staged and
fused pipelines and the analytic optimum, all in one Spark application; then the
adaptive policy again as the client of a Spark Connect server (a second application).

    python -m benchmarks.w1_memory [--quick]
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from functools import partial

from benchmarks.common import (
    MiB,
    connect_session,
    engine_context,
    lock_dir,
    markdown_table,
    parse_args,
    save,
    slot,
    spark_session,
    timed,
    warm_up,
)


@dataclass
class W1:
    tasks: int = 48
    rows: int = 40
    load_s: float = 1.0
    row_s: float = 0.05
    batch_rows: int = 20
    batch_s: float = 0.1
    cpus: int = 4
    gpus: int = 2
    limits_mib: tuple = (128, 256, 512, 1024, 2048)

    @property
    def optimum_s(self) -> float:
        cpu = self.tasks * (self.load_s + self.rows * self.row_s) / self.cpus
        gpu = self.tasks * (self.rows / self.batch_rows) * self.batch_s / self.gpus
        return max(cpu, gpu)

    @property
    def intermediate_bytes(self) -> int:
        return self.tasks * self.rows * MiB


QUICK = W1(tasks=8, rows=8, load_s=0.3, row_s=0.05, batch_rows=4, batch_s=0.1, limits_mib=(32, 256))


# -- the workload's operators (module-level so Spark workers import them) ----------
def load(row, cfg: W1):
    time.sleep(cfg.load_s)
    return [{"task": row["id"], "i": i, "data": os.urandom(16) + bytes(MiB - 16)} for i in range(cfg.rows)]


def transform(row, cfg: W1):
    time.sleep(cfg.row_s)
    return {"task": row["task"], "i": row["i"], "data": bytes(MiB - 16) + os.urandom(16)}


def inference(batch, cfg: W1):
    import pyarrow as pa

    time.sleep(cfg.batch_s * batch.num_rows / cfg.batch_rows)
    return pa.table({"task": batch["task"], "i": batch["i"]})


# -- systems -----------------------------------------------------------------------
def run_ours(cfg: W1, policy: str, limit: int) -> dict:
    import airflow_streambatch.engine as sb

    engine_context(memory_limit=limit, scheduling_policy=policy, resources={"CPU": cfg.cpus, "GPU": cfg.gpus})
    ds = (
        sb.range(cfg.tasks)
        .flat_map(partial(load, cfg=cfg))
        .map(partial(transform, cfg=cfg))
        .map_batches(partial(inference, cfg=cfg), batch_size=cfg.batch_rows, num_gpus=1, batch_format="pyarrow")
    )
    wall, rows = timed(ds.count)
    assert rows == cfg.tasks * cfg.rows, rows
    return {"time_s": wall, "peak_bytes": ds.last_run_stats.peak_memory_bytes, "ok": True}


def _staged_load(it, cfg, locks):
    for row in it:
        with slot(locks, "cpu", cfg.cpus):
            out = load({"id": row}, cfg)
        yield from out


def _staged_transform(it, cfg, locks):
    for row in it:
        with slot(locks, "cpu", cfg.cpus):
            yield transform(row, cfg)


def _staged_inference(it, cfg, locks):
    import pyarrow as pa

    rows = list(it)
    for start in range(0, len(rows), cfg.batch_rows):
        batch = rows[start:start + cfg.batch_rows]
        with slot(locks, "gpu", cfg.gpus):
            inference(pa.Table.from_pylist([{"task": r["task"], "i": r["i"]} for r in batch]), cfg)
    yield len(rows)


def run_spark_staged(spark, cfg: W1, locks: str) -> dict:
    """Batch model: each stage materialized (persisted, counted) before the next starts."""
    from pyspark import StorageLevel

    sc = spark.sparkContext
    held = 0

    def go():
        nonlocal held
        loaded = sc.parallelize(range(cfg.tasks), cfg.tasks).mapPartitions(partial(_staged_load, cfg=cfg, locks=locks))
        loaded.persist(StorageLevel.MEMORY_AND_DISK).count()
        transformed = loaded.mapPartitions(partial(_staged_transform, cfg=cfg, locks=locks))
        transformed.persist(StorageLevel.MEMORY_AND_DISK).count()
        held = 2 * cfg.intermediate_bytes  # both stages are held while the second materializes
        loaded.unpersist()
        total = sum(transformed.mapPartitions(partial(_staged_inference, cfg=cfg, locks=locks)).collect())
        transformed.unpersist()
        return total

    wall, rows = timed(go)
    assert rows == cfg.tasks * cfg.rows
    return {"time_s": wall, "peak_bytes": held, "ok": True}


def _fused(it, cfg, locks):
    import pyarrow as pa

    count = 0
    for row in it:
        with slot(locks, "gpu", cfg.gpus):  # the fused task holds the scarcest resource throughout
            rows = [transform(r, cfg) for r in load({"id": row}, cfg)]
            for start in range(0, len(rows), cfg.batch_rows):
                batch = rows[start:start + cfg.batch_rows]
                inference(pa.Table.from_pylist([{"task": r["task"], "i": r["i"]} for r in batch]), cfg)
            count += len(rows)
    yield count


def run_spark_fused(spark, cfg: W1, locks: str) -> dict:
    sc = spark.sparkContext
    source = sc.parallelize(range(cfg.tasks), cfg.tasks)
    wall, rows = timed(lambda: sum(source.mapPartitions(partial(_fused, cfg=cfg, locks=locks)).collect()))
    assert rows == cfg.tasks * cfg.rows
    return {"time_s": wall, "peak_bytes": cfg.rows * MiB * cfg.gpus, "ok": True}


class RayInference:
    """``inference`` in a Ray actor: Ray retires a task's worker after each GPU task
    (``max_calls=1`` for ``num_gpus`` > 0), so GPU inference in Ray Data runs in an actor pool."""

    def __init__(self, cfg: W1):
        self.cfg = cfg

    def __call__(self, batch):
        return inference(batch, self.cfg)


def _ray_pipeline(cfg: W1):
    import ray.data

    return (
        ray.data.range(cfg.tasks)
        .flat_map(partial(load, cfg=cfg))
        .map(partial(transform, cfg=cfg))
        # GPU slots only, like ours and the Spark baselines: Ray's default num_cpus=1 would make
        # inference compete with transform for the 4 CPU slots
        .map_batches(RayInference, fn_constructor_kwargs={"cfg": cfg}, concurrency=cfg.gpus,
                     batch_size=cfg.batch_rows, batch_format="pyarrow", num_gpus=1, num_cpus=0)
    )


def _ray_rows(ds) -> int:
    """Consume the output as ours' ``count`` does; Ray's ``count()`` would add a Project
    operator that reserves a CPU slot of its own."""
    return sum(batch.num_rows for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"))


def run_ray(cfg: W1, limit: int) -> dict | None:
    """Ray Data with the same operators, slots (4 CPU, 2 GPU as logical resources) and memory limit
    (its resource manager's object-store budget); None when ``ray[data]`` is not installed."""
    try:
        import ray
        import ray.data
    except ImportError:
        return None
    ray.init(num_cpus=cfg.cpus, num_gpus=cfg.gpus, include_dashboard=False, log_to_driver=False,
             object_store_memory=max(limit * 2, 256 * MiB),
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
    try:
        # start Ray's worker processes before timing, as warm_up does for Spark's Python workers
        _ray_rows(_ray_pipeline(W1(tasks=cfg.cpus + cfg.gpus, rows=1, load_s=0, row_s=0, batch_rows=1, batch_s=0)))
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(
            object_store_memory=limit)
        wall, rows = timed(lambda: _ray_rows(_ray_pipeline(cfg)))
        assert rows == cfg.tasks * cfg.rows, rows
        return {"time_s": wall, "ok": True}
    finally:
        ray.shutdown()


def main() -> None:
    args = parse_args(__doc__)
    cfg = QUICK if args.quick else W1()
    spark = spark_session(cfg.cpus + cfg.gpus + 2)
    warm_up(cfg.cpus + cfg.gpus + 2)
    locks = lock_dir()
    opt = cfg.optimum_s
    results: dict[str, dict] = {"config": asdict(cfg), "optimum_s": opt, "runs": {}}

    staged = run_spark_staged(spark, cfg, locks)
    fused = run_spark_fused(spark, cfg, locks)
    print(f"spark-staged {staged['time_s']:.1f}s  spark-fused {fused['time_s']:.1f}s  optimum {opt:.1f}s", flush=True)
    headers = ["system"] + [f"{m} MiB" for m in cfg.limits_mib]
    rows = []
    for name, run in (("spark-staged", staged), ("spark-fused", fused)):
        cells = []
        for mib in cfg.limits_mib:
            fits = run["peak_bytes"] <= mib * MiB
            ratio = f"{run['time_s'] / opt:.2f}x"
            cells.append(ratio if fits else f"fails (holds {run['peak_bytes'] // MiB} MiB; {ratio} unlimited)")
        rows.append([name] + cells)
        results["runs"][name] = run
    for policy in ("adaptive", "conservative"):
        cells = []
        for mib in cfg.limits_mib:
            run = run_ours(cfg, policy, mib * MiB)
            results["runs"][f"ours-{policy}@{mib}"] = run
            cells.append(f"{run['time_s'] / opt:.2f}x (peak {run['peak_bytes'] / MiB:.0f} MiB)")
            print(f"ours-{policy} @ {mib} MiB: {run['time_s']:.1f}s peak {run['peak_bytes'] / MiB:.0f} MiB", flush=True)
        rows.append([f"ours-{policy}"] + cells)
    # the default policy again, unchanged, as the client of a Spark Connect server (a process of its own)
    with connect_session(cfg.cpus + cfg.gpus + 2):
        warm_up(cfg.cpus + cfg.gpus + 2)
        cells = []
        for mib in cfg.limits_mib:
            run = run_ours(cfg, "adaptive", mib * MiB)
            results["runs"][f"ours-adaptive-connect@{mib}"] = run
            versus = run["time_s"] / results["runs"][f"ours-adaptive@{mib}"]["time_s"]
            cells.append(f"{run['time_s'] / opt:.2f}x ({versus:.2f}x classic)")
            print(f"ours-adaptive on Spark Connect @ {mib} MiB: {run['time_s']:.1f}s ({versus:.2f}x classic)",
                  flush=True)
        rows.append(["ours-adaptive, Spark Connect"] + cells)
    ray_cells = []
    for mib in cfg.limits_mib:
        run = run_ray(cfg, mib * MiB)
        if run is None:
            ray_cells = ["skipped: ray[data] not installed"] * len(cfg.limits_mib)
            break
        results["runs"][f"ray-data@{mib}"] = run
        ray_cells.append(f"{run['time_s'] / opt:.2f}x")
        print(f"ray-data @ {mib} MiB: {run['time_s']:.1f}s", flush=True)
    rows.append(["ray-data"] + ray_cells)
    rows.append(["optimal"] + [f"1.00x ({opt:.1f} s)"] * len(cfg.limits_mib))
    table = (f"W1: completion time / optimum ({opt:.1f} s), {cfg.tasks} tasks x {cfg.rows} rows of 1 MiB, "
             f"{cfg.cpus} CPU + {cfg.gpus} GPU slots\n\n" + markdown_table(headers, rows))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for policy in ("adaptive", "conservative"):
        ys = [results["runs"][f"ours-{policy}@{m}"]["time_s"] / opt for m in cfg.limits_mib]
        ax.plot(cfg.limits_mib, ys, marker="o", label=f"ours-{policy}")
    for name, run in (("spark-staged", staged), ("spark-fused", fused)):
        xs = [m for m in cfg.limits_mib if run["peak_bytes"] <= m * MiB]
        ax.plot(xs, [run["time_s"] / opt] * len(xs), marker="s", linestyle="--", label=name)
    ray_runs = [results["runs"].get(f"ray-data@{m}") for m in cfg.limits_mib]
    if all(ray_runs):
        ax.plot(cfg.limits_mib, [r["time_s"] / opt for r in ray_runs], marker="^", label="ray-data")
    ax.axhline(1.0, color="grey", linewidth=0.8, label="optimal")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("memory limit (MiB)")
    ax.set_ylabel("completion time / optimum")
    ax.set_title("W1 memory-aware scheduling")
    ax.legend()
    save(args.out, "w1_memory" + ("_quick" if args.quick else ""), results, table, fig)


if __name__ == "__main__":
    main()
