"""W5: exploding partitions (paper 5.1.2, the video case), sleep-based, real bytes.

Each input row decodes into ``f`` rows of 1 MiB (a video into frames), with ``f``
spread over ``spread``x between the smallest and the largest input; a second
operator spends ``process_s`` per MiB and keeps a few bytes. Decoding streams: it
yields one 1 MiB row at a time. Under a fixed memory limit:

* spark-staged (the batch model): decode is materialized (``persist``
  MEMORY_AND_DISK + count) before processing; Spark keeps what fits in its storage
  memory and spills the rest to disk.
* ours: the decoding task cuts its output into blocks at the target size as it
  goes (streaming repartition) and the scheduler stops launching decodes while
  the blocks in flight would pass ``memory_limit``.

Peak memory is measured, not computed: the summed RSS of every process (driver,
JVM, Python workers) plus our blocks in tmpfs, minus what the idle application held
before the run; Spark's spill is its storage status's disk bytes.

    python -m benchmarks.w5_exploding [--quick]
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial

from benchmarks.common import MiB, PeakMemory, engine_context, markdown_table, parse_args, save, spark_session, warm_up


@dataclass
class W5:
    inputs: int = 16
    min_mib: int = 4
    spreads: tuple = (10, 25)  # largest / smallest decoded input
    decode_s: float = 0.01  # per MiB produced
    process_s: float = 0.02  # per MiB consumed
    limit_mib: int = 256
    cpus: int = 4
    block_mib: int = 16

    def sizes(self, spread: int) -> list[int]:
        """Decoded MiB per input, spread evenly from min_mib to spread * min_mib, interleaved."""
        top = self.min_mib * spread
        sizes = [round(self.min_mib + (top - self.min_mib) * i / (self.inputs - 1)) for i in range(self.inputs)]
        return sizes[::2] + sizes[1::2]


QUICK = W5(inputs=6, min_mib=2, spreads=(10,), limit_mib=48, decode_s=0.005, process_s=0.005, block_mib=4)


def decode(mib: int, decode_s: float):
    """One input's frames: ``mib`` rows of 1 MiB, produced one at a time."""
    for _ in range(mib):
        time.sleep(decode_s)
        yield os.urandom(16) + bytes(MiB - 16)


def _ours_decode(batch, sizes: list[int], decode_s: float):
    import pyarrow as pa

    for index in batch.column("id").to_pylist():
        for frame in decode(sizes[index], decode_s):
            yield pa.table({"input": [index], "frame": pa.array([frame], pa.binary())})


def _ours_process(batch, process_s: float):
    import pyarrow as pa

    time.sleep(process_s * batch.num_rows)
    return pa.table({"input": batch.column("input"), "bytes": [len(f) for f in batch.column("frame").to_pylist()]})


def run_ours(cfg: W5, sizes: list[int], policy: str, block_dir: str) -> dict:
    import airflow_streambatch.engine as sb

    engine_context(memory_limit=cfg.limit_mib * MiB, scheduling_policy=policy, resources={"CPU": cfg.cpus},
                   target_max_block_size=cfg.block_mib * MiB, block_dir=block_dir, enable_operator_fusion=False)
    ds = (sb.range(len(sizes), override_num_blocks=len(sizes))
          .map_batches(partial(_ours_decode, sizes=sizes, decode_s=cfg.decode_s), batch_size=1)
          .map_batches(partial(_ours_process, process_s=cfg.process_s), batch_size=cfg.block_mib))
    with PeakMemory(tmpfs_dir=block_dir) as mem:
        start = time.perf_counter()
        rows = ds.count()
        wall = time.perf_counter() - start
    assert rows == sum(sizes), (rows, sum(sizes))
    return {"time_s": wall, "peak_bytes": mem.peak, "accounted_peak_bytes": ds.last_run_stats.peak_memory_bytes,
            "spilled_bytes": 0}


def _staged_decode(it, sizes, decode_s):
    for index in it:
        for frame in decode(sizes[index], decode_s):
            yield index, frame


def _staged_process(it, process_s):
    for index, frame in it:
        time.sleep(process_s)
        yield index, len(frame)


def run_spark_staged(spark, cfg: W5, sizes: list[int]) -> dict:
    from pyspark import StorageLevel

    sc = spark.sparkContext
    with PeakMemory() as mem:
        start = time.perf_counter()
        decoded = sc.parallelize(range(len(sizes)), len(sizes)).mapPartitions(
            partial(_staged_decode, sizes=sizes, decode_s=cfg.decode_s))
        decoded.persist(StorageLevel.MEMORY_AND_DISK).count()
        info = [i for i in sc._jsc.sc().getRDDStorageInfo() if i.id() == decoded.id()]
        in_memory, on_disk = (info[0].memSize(), info[0].diskSize()) if info else (0, 0)
        rows = decoded.mapPartitions(partial(_staged_process, process_s=cfg.process_s)).count()
        decoded.unpersist()
        wall = time.perf_counter() - start
    assert rows == sum(sizes)
    return {"time_s": wall, "peak_bytes": mem.peak, "held_in_memory_bytes": in_memory, "spilled_bytes": on_disk}


def main() -> None:
    args = parse_args(__doc__)
    cfg = QUICK if args.quick else W5()
    spark = spark_session(cfg.cpus)
    warm_up(cfg.cpus)
    block_dir = tempfile.mkdtemp(prefix="streambatch-w5-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    idle = PeakMemory(tmpfs_dir=block_dir).sample()
    results = {"config": asdict(cfg), "idle_bytes": idle, "runs": {}}
    rows = []
    for spread in cfg.spreads:
        sizes = cfg.sizes(spread)
        runs = {"spark-staged": run_spark_staged(spark, cfg, sizes)}
        for policy in ("adaptive", "conservative"):
            runs[f"ours-{policy}"] = run_ours(cfg, sizes, policy, block_dir)
        for name, run in runs.items():
            above_idle = max(0, run["peak_bytes"] - idle)
            run["peak_above_idle_bytes"] = above_idle
            verdict = "under" if above_idle <= cfg.limit_mib * MiB else "OVER"
            spill = f", spilled {run['spilled_bytes'] / MiB:.0f} MiB" if run["spilled_bytes"] else ""
            rows.append([f"{spread}x ({min(sizes)}-{max(sizes)} MiB, {sum(sizes)} MiB total)", name,
                         f"{run['time_s']:.1f}", f"{above_idle / MiB:.0f} ({verdict} {cfg.limit_mib}){spill}"])
            print(f"{spread}x {name}: {run['time_s']:.1f} s, peak {above_idle / MiB:.0f} MiB above idle{spill}",
                  flush=True)
        results["runs"][f"{spread}x"] = runs
    table = (f"W5: {cfg.inputs} inputs decoding to 1 MiB frames, memory limit {cfg.limit_mib} MiB, "
             f"{cfg.cpus} CPU slots\n\n"
             + markdown_table(["input sizes", "system", "time s", "peak MiB above idle (vs limit)"], rows))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(next(iter(results["runs"].values())))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ys = [results["runs"][f"{s}x"][name]["peak_above_idle_bytes"] / MiB for s in cfg.spreads]
        ax.bar([x + i * width for x in range(len(cfg.spreads))], ys, width, label=name)
    ax.axhline(cfg.limit_mib, color="red", linewidth=1, label="memory limit")
    ax.set_xticks([x + width for x in range(len(cfg.spreads))], [f"{s}x spread" for s in cfg.spreads])
    ax.set_ylabel("peak memory above idle (MiB)")
    ax.set_title("W5 exploding partitions")
    ax.legend()
    save(args.out, "w5_exploding" + ("_quick" if args.quick else ""), results, table, fig)


if __name__ == "__main__":
    main()
