"""W5: exploding partitions (paper 5.1.2, the video case), sleep-based, real bytes.

Each input decodes into ``f`` frames of 1 MiB (a video into frames) on CPU slots,
with ``f`` spread over ``spread``x between the smallest and the largest input; an
inference operator on (simulated) GPU slots spends ``infer_s`` per frame and keeps
a few bytes. Decoding streams: it yields one frame at a time. Both systems get the
same memory limit for intermediate data:

* spark-staged (the batch model): an executor (here the local driver) of 1 GiB heap
  whose unified memory (execution + storage) is set to the limit
  (``spark.memory.fraction``); the decoded stage is persisted MEMORY_AND_DISK and
  counted, then inference runs over it. What does not fit in storage memory is
  spilled to disk (Spark's storage status says how much). It runs in a child
  process, its own Spark application, so that when its JVM runs out of heap the
  failure is recorded and the other systems still run.
* ours: decoding tasks cut their output into blocks at the target size as they go
  and pass each block on while they run (streaming repartition + streaming task
  output); a task that would write past the memory limit waits for the scheduler's
  grant, and inference consumes blocks as they appear.

Measured, not computed: the peak bytes of intermediate data in memory (ours: the
block files in tmpfs, sampled every 50 ms; spark-staged: its storage memory, and its
spill), and the peak memory of every process (driver, JVM, Python workers) above the
idle application, as proportional set size (PSS) so pages forked workers share are
counted once. Both plus time, per spread.

    python -m benchmarks.w5_exploding [--quick]
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from functools import partial

from benchmarks.common import (
    MiB,
    PeakMemory,
    engine_context,
    lock_dir,
    markdown_table,
    parse_args,
    save,
    slot,
    spark_session,
    warm_up,
)

DRIVER_MEMORY_MIB = 1024
SPARK_RESERVED_MIB = 300  # Spark keeps this much of the heap out of its unified memory


@dataclass
class W5:
    inputs: int = 16
    min_mib: int = 2
    spreads: tuple = (10, 30, 100)  # largest / smallest decoded input
    decode_s: float = 0.005  # per frame (1 MiB) decoded
    infer_s: float = 0.01  # per frame inferred
    limit_mib: int = 256
    cpus: int = 4
    gpus: int = 2
    block_mib: int = 16

    def sizes(self, spread: int) -> list[int]:
        """Decoded MiB per input, spread evenly from min_mib to spread * min_mib, large and small interleaved."""
        top = self.min_mib * spread
        sizes = [round(self.min_mib + (top - self.min_mib) * i / (self.inputs - 1)) for i in range(self.inputs)]
        return sizes[::2] + sizes[1::2]


QUICK = W5(inputs=6, min_mib=1, spreads=(10, 30), limit_mib=24, decode_s=0.002, infer_s=0.002, block_mib=4)


# Frames must not compress: Spark compresses what it caches serialized and spills, and
# zero-filled frames shrank 200x there. One random MiB per process, with a fresh prefix.
_NOISE = os.urandom(MiB)


def decode(mib: int, decode_s: float):
    """One input's frames: ``mib`` rows of 1 MiB, produced one at a time."""
    for _ in range(mib):
        time.sleep(decode_s)
        yield os.urandom(16) + _NOISE[16:]


def _ours_decode(batch, sizes: list[int], decode_s: float):
    import pyarrow as pa

    for index in batch.column("id").to_pylist():
        for frame in decode(sizes[index], decode_s):
            yield pa.table({"input": [index], "frame": pa.array([frame], pa.binary())})


def _ours_infer(batch, infer_s: float):
    import pyarrow as pa

    time.sleep(infer_s * batch.num_rows)
    return pa.table({"input": batch.column("input"), "bytes": [len(f) for f in batch.column("frame").to_pylist()]})


def run_ours(cfg: W5, sizes: list[int], policy: str, block_dir: str) -> dict:
    import airflow_streambatch.engine as sb

    engine_context(memory_limit=cfg.limit_mib * MiB, scheduling_policy=policy, block_dir=block_dir,
                   resources={"CPU": cfg.cpus, "GPU": cfg.gpus}, target_max_block_size=cfg.block_mib * MiB)
    ds = (sb.range(len(sizes))
          .map_batches(partial(_ours_decode, sizes=sizes, decode_s=cfg.decode_s), batch_size=1, batch_format="pyarrow")
          .map_batches(partial(_ours_infer, infer_s=cfg.infer_s), batch_size=cfg.block_mib, num_gpus=1,
                       batch_format="pyarrow"))
    with PeakMemory(kind="pss") as processes, PeakMemory(tmpfs_dir=block_dir, processes=False,
                                                         interval_s=0.05) as blocks:
        start = time.perf_counter()
        rows = ds.count()
        wall = time.perf_counter() - start
    assert rows == sum(sizes), (rows, sum(sizes))
    return {"time_s": wall, "data_in_memory_bytes": blocks.peak, "spilled_bytes": 0,
            "accounted_bytes": ds.last_run_stats.peak_memory_bytes, "processes_bytes": processes.peak}


def _staged_decode(it, sizes, decode_s, locks, cpus):
    for index in it:
        with slot(locks, "cpu", cpus):
            for frame in decode(sizes[index], decode_s):
                yield index, frame


def _staged_infer(it, infer_s, locks, gpus):
    count = 0
    for _index, frame in it:
        with slot(locks, "gpu", gpus):
            time.sleep(infer_s)
        count += len(frame) > 0
    yield count


def run_spark_staged(spark, cfg: W5, sizes: list[int], locks: str) -> dict:
    from pyspark import StorageLevel

    sc = spark.sparkContext
    with PeakMemory(kind="pss") as processes:
        start = time.perf_counter()
        decoded = sc.parallelize(range(len(sizes)), len(sizes)).mapPartitions(
            partial(_staged_decode, sizes=sizes, decode_s=cfg.decode_s, locks=locks, cpus=cfg.cpus))
        decoded.persist(StorageLevel.MEMORY_AND_DISK).count()
        info = [i for i in sc._jsc.sc().getRDDStorageInfo() if i.id() == decoded.id()]
        in_memory, on_disk = (info[0].memSize(), info[0].diskSize()) if info else (0, 0)
        rows = sum(decoded.mapPartitions(partial(_staged_infer, infer_s=cfg.infer_s, locks=locks,
                                                 gpus=cfg.gpus)).collect())
        decoded.unpersist(blocking=True)
        wall = time.perf_counter() - start
    assert rows == sum(sizes), (rows, sum(sizes))
    return {"time_s": wall, "data_in_memory_bytes": in_memory, "spilled_bytes": on_disk,
            "processes_bytes": processes.peak}


STAGED_MARK = "W5-STAGED "


def staged_in_child(cfg: W5, spread: int, quick: bool) -> dict:
    """spark-staged in its own process and Spark application; a crash is a recorded failure."""
    cmd = [sys.executable, "-m", "benchmarks.w5_exploding", "--staged-spread", str(spread)] + (["--quick"] * quick)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    for line in proc.stdout.splitlines():
        if line.startswith(STAGED_MARK):
            return json.loads(line[len(STAGED_MARK):])
    errors = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if "Error" in line]
    return {"failed": errors[0] if errors else f"exit code {proc.returncode}"}


def staged_child(cfg: W5, spread: int) -> None:
    spark = start_spark(cfg)
    warm_up(cfg.cpus + cfg.gpus)
    idle = PeakMemory(kind="pss").sample()
    try:
        run = run_spark_staged(spark, cfg, cfg.sizes(spread), lock_dir())
        run["processes_above_idle_bytes"] = max(0, run["processes_bytes"] - idle)
    except Exception as exc:  # noqa: BLE001 - the failure is the measurement
        text = str(exc)
        oom = re.search(r"java\.lang\.OutOfMemoryError: [\w ]+", text)
        run = {"failed": oom.group(0) if oom else f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"}
    print(STAGED_MARK + json.dumps(run), flush=True)


def start_spark(cfg: W5):
    fraction = cfg.limit_mib / (DRIVER_MEMORY_MIB - SPARK_RESERVED_MIB)
    return spark_session(cfg.cpus + cfg.gpus, driver_memory=f"{DRIVER_MEMORY_MIB}m",
                         conf={"spark.memory.fraction": f"{fraction:.4f}"})


def spark_storage_bytes(spark) -> int:
    """The storage memory Spark's memory manager offers now (its whole unified memory when idle)."""
    return spark.sparkContext._jvm.org.apache.spark.SparkEnv.get().memoryManager().maxOnHeapStorageMemory()


def main() -> None:
    args = parse_args(__doc__, {"--staged-spread": {"type": int, "help": "internal: run spark-staged alone"}})
    cfg = QUICK if args.quick else W5()
    if args.staged_spread:
        return staged_child(cfg, args.staged_spread)
    spark = start_spark(cfg)
    warm_up(cfg.cpus + cfg.gpus)
    storage = spark_storage_bytes(spark)
    block_dir = tempfile.mkdtemp(prefix="streambatch-w5-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    idle = PeakMemory(kind="pss").sample()
    results = {"config": asdict(cfg), "spark_storage_memory_bytes": storage, "idle_processes_bytes": idle,
               "runs": {}}
    print(f"Spark unified memory (storage available): {storage / MiB:.0f} MiB; limit {cfg.limit_mib} MiB", flush=True)
    rows = []
    for spread in cfg.spreads:
        sizes = cfg.sizes(spread)
        runs = {"spark-staged": staged_in_child(cfg, spread, args.quick)}
        for policy in ("adaptive", "conservative"):
            runs[f"ours-{policy}"] = run = run_ours(cfg, sizes, policy, block_dir)
            run["processes_above_idle_bytes"] = max(0, run["processes_bytes"] - idle)
        label = f"{spread}x ({min(sizes)}-{max(sizes)} MiB, {sum(sizes)} MiB total)"
        for name, run in runs.items():
            if "failed" in run:
                rows.append([label, name, "fails", run["failed"], "", ""])
                print(f"{spread}x {name}: fails: {run['failed']}", flush=True)
                continue
            in_memory = run["data_in_memory_bytes"] / MiB
            verdict = "under" if in_memory <= cfg.limit_mib else "OVER"
            spilled = run["spilled_bytes"] / MiB
            rows.append([label, name, f"{run['time_s']:.1f}", f"{in_memory:.0f} ({verdict})",
                         f"{spilled:.0f}" if spilled else "0", f"{run['processes_above_idle_bytes'] / MiB:.0f}"])
            print(f"{spread}x {name}: {run['time_s']:.1f} s, data in memory {in_memory:.0f} MiB, "
                  f"spilled {spilled:.0f} MiB, processes +{run['processes_above_idle_bytes'] / MiB:.0f} MiB",
                  flush=True)
        results["runs"][f"{spread}x"] = runs
    table = (f"W5: {cfg.inputs} inputs decoding to 1 MiB frames, memory limit {cfg.limit_mib} MiB for intermediate "
             f"data (Spark unified memory {storage / MiB:.0f} MiB), {cfg.cpus} CPU + {cfg.gpus} GPU slots, "
             f"blocks of {cfg.block_mib} MiB\n\n"
             + markdown_table(["input sizes", "system", "time s", "peak data in memory MiB (vs limit)",
                               "spilled to disk MiB", "processes' peak PSS above idle MiB"], rows))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(next(iter(results["runs"].values())))
    width = 0.8 / len(names)
    xs = range(len(cfg.spreads))
    for i, name in enumerate(names):
        runs = [results["runs"][f"{s}x"][name] for s in cfg.spreads]
        at = [x + i * width for x in xs]
        memory = [r.get("data_in_memory_bytes", 0) / MiB for r in runs]
        left.bar(at, memory, width, label=name)
        left.bar(at, [r.get("spilled_bytes", 0) / MiB for r in runs], width, bottom=memory, color="none",
                 edgecolor="black", hatch="//", label="spilled to disk" if i == 0 else None)
        right.bar(at, [r.get("time_s", 0) for r in runs], width, label=name)
        for x, r in zip(at, runs):
            if "failed" in r:
                for ax in (left, right):
                    ax.text(x, 0, "fails\n(out of\nmemory)" if "OutOfMemory" in r["failed"] else "fails",
                            ha="center", va="bottom", fontsize=7, color="red")
    left.axhline(cfg.limit_mib, color="red", linewidth=1, label="memory limit")
    for ax in (left, right):
        ax.set_xticks([x + width for x in xs], [f"{s}x spread" for s in cfg.spreads])
    left.set_ylabel("intermediate data (MiB)")
    left.set_title("peak in memory (+ spilled)")
    right.set_ylabel("seconds")
    right.set_title("completion time")
    left.legend(fontsize=8)
    fig.suptitle("W5 exploding partitions")
    save(args.out, "w5_exploding" + ("_quick" if args.quick else ""), results, table, fig)


if __name__ == "__main__":
    main()
