"""W7: many hosts, no shared filesystem (WORKLOADS.md W7).

The W1 pipeline (Load -> Transform on CPU slots -> Inference on GPU slots, 1 MiB rows)
on a Spark standalone cluster of two workers where each worker and the driver is a
host of its own: a private mount namespace with its own ``/dev/shm`` and ``/tmp``
(`tests/namespaced_cluster.py`). Input (one Parquet file per load task) and output
(`write_parquet`) live in a directory every host sees. Two runs of the same pipeline:

* (a) host-local blocks: engine defaults, each task writes its blocks to its own host's
  tmpfs and consumers on the other host fetch them from that host's agent (Arrow Flight);
* (b) ``DataContext.block_dir`` set to a directory every host sees (under /var/tmp, a
  disk filesystem here), so every read is a local memory map.

alternated (a, b, a, b, a, b) in one driver application, engine defaults except what W1
sets (slots ``{"CPU": 4, "GPU": 2}``, a memory limit: 512 MiB, one of W1's points).
Each worker offers 4 Spark task slots (8 in all, as W1's ``local[cpus + gpus + 2]``; the
machine has 2 real cores) and one pretend GPU (a discovery script), so ``num_gpus=1``
inference runs where Spark assigns a GPU, and holds a lock-file slot in the shared
directory besides. Reported: wall time, time over W1's analytic optimum, (a)/(b), and
``RunStats.cross_host_bytes``.

Then moving one 128 MiB block (a binary column of random bytes as an Arrow IPC file):
engine reads (a Spark task on the writer's host memory-maps it; a task on the other
host, and the driver, fetch it through the writer's host agent with `transport.read_any`)
against Spark's block manager (the same IPC bytes as one ``MEMORY_ONLY`` RDD partition
cached on one executor, read by a task on that executor, by a task on the other one,
and collected to the driver). "Read" means the same thing everywhere: end with a
``pa.Table`` in the reading process and touch every byte of its buffers (a uint64 sum).
Each worker-side read is a one-task Spark job pinned to its worker (a barrier job holds
every slot of the other one meanwhile), after every Python worker imported what it needs
and, for the engine, read the block once (connected its Flight client); timed as the
driver sees the job, best of 3, and net of an empty one-task job. The task's own clock
is reported too: exact for the engine, a lower bound for Spark (its JVM can fetch the
partition before the Python function starts).

    python -m benchmarks.w7_multihost [--quick] [--out docs/bench]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from functools import partial

from benchmarks.common import MiB, markdown_table, parse_args, save, slot
from benchmarks.w1_memory import W1, inference, load, transform
from benchmarks.w7_hosts import CORES_PER_WORKER, W7, _emit, _root, _session
from benchmarks.w7_transport import transport_driver

_tests = os.path.join(_root, "tests")

WORKER_MEMORY = "2g"
GPU_DISCOVERY = '#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0"]}\'\n'  # one pretend GPU per worker


QUICK = W7(tasks=16, rows=20, repeats=1, block_mib=16)


# -- executed on the hosts (module-level: Spark workers import them from this module) -----------
def gpu_inference(batch, cfg: W1, locks: str):
    """W1's inference, holding one of the ``gpus`` lock-file slots (in a directory every host sees)
    besides the GPU Spark assigned the task."""
    with slot(locks, "gpu", cfg.gpus):
        return inference(batch, cfg)


# -- the drivers (each a process on its own host, started by `NamespacedCluster.run_driver`) -------
def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the machine so far (/proc/stat; every namespace sees the same)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def _output_check(out: str, table, cfg: W7) -> dict:
    """What a wrong output holds: tasks whose rows are not there exactly once, and every file
    of the output (Parquet files with their rows and tasks, commit records as text)."""
    import collections

    import pyarrow.parquet as pq

    counts = collections.Counter(zip(table["task"].to_pylist(), table["i"].to_pylist()))
    per_task = collections.Counter(task for task, _ in counts.elements())
    bad = sorted(t for t in range(cfg.tasks) if per_task.get(t, 0) != cfg.rows)
    files = {}
    for folder, _, names in os.walk(out):
        for name in sorted(names):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, out)
            if name.endswith(".parquet"):
                part = pq.read_table(path)
                files[rel] = {"rows": part.num_rows, "tasks": sorted(set(part["task"].to_pylist()))}
            elif name.endswith(".json"):
                with open(path) as f:
                    files[rel] = f.read()[:2000]
            else:
                files[rel] = os.path.getsize(path)
    return {"rows_per_bad_task": {t: per_task.get(t, 0) for t in bad},
            "duplicated_pairs": sum(1 for n in counts.values() if n > 1), "files": files}


def pipeline_driver(spec: dict) -> None:
    """Runs (a) and (b) alternated in one application; prints ``RUN {json}`` after each."""
    import pyarrow.parquet as pq

    from benchmarks.common import engine_context, warm_up

    cfg = W7(**spec["cfg"])
    w1 = cfg.w1()
    spark = _session(spec, "pipeline", {"spark.executor.memory": "512m", "spark.executor.resource.gpu.amount": "1"})
    import airflow_streambatch.engine as sb

    warm_up(CORES_PER_WORKER * 2)  # Python workers on both executors, before anything is timed
    for index, mode in enumerate(spec["order"]):
        settings = {"memory_limit": cfg.memory_limit_mib * MiB, "resources": {"CPU": cfg.cpus, "GPU": cfg.gpus}}
        if mode == "b":
            settings["block_dir"] = spec["shared_blocks"]
        ctx = engine_context(**settings)
        ds = (
            sb.read_parquet(spec["input"])
            .flat_map(partial(load, cfg=w1))
            .map(partial(transform, cfg=w1))
            .map_batches(partial(gpu_inference, cfg=w1, locks=spec["locks"]), batch_size=w1.batch_rows, num_gpus=1,
                         batch_format="pyarrow")
        )
        out = os.path.join(spec["output"], f"{index}-{mode}")
        load_before, cpu_before = os.getloadavg()[0], _cpu_ticks()
        start = time.perf_counter()
        result = ds.write_parquet(out)
        wall = time.perf_counter() - start
        cpu_after = _cpu_ticks()
        stats = ds.last_run_stats
        table = pq.read_table(out)
        pairs = set(zip(table["task"].to_pylist(), table["i"].to_pylist()))
        ok = table.num_rows == cfg.tasks * cfg.rows and len(pairs) == table.num_rows
        extra = {} if ok else {"output_check": _output_check(out, table, cfg)}
        _emit("RUN", {
            "index": index, "mode": mode, "block_dir": ctx.block_dir, "wall_s": wall, "rows": table.num_rows,
            "exactly_once": ok, "committed": len(result.committed),
            "cross_host_bytes": stats.cross_host_bytes, "driver_fetched_bytes": stats.driver_fetched_bytes,
            "fetched_by_operator": {op.name: op.fetched_bytes for op in stats.ops},
            "peak_memory_bytes": stats.peak_memory_bytes, "spark_jobs": len(stats.launch_log),
            "loadavg_1m": [load_before, os.getloadavg()[0]],
            # of the whole machine (every "host", and anything else running on it)
            "cpu_busy": (cpu_after[0] - cpu_before[0]) / max(1, cpu_after[1] - cpu_before[1]),
            "retries": {op.name: {"retried": op.tasks_retried, "rerun": op.tasks_rerun} for op in stats.ops},
            "stats": stats.summary(), **extra,
        })
    spark.stop()


def driver_main(argv: list[str]) -> None:
    """A driver process (``_drive`` starts it on a host of its own): ``argv`` is the kind, then the spec's JSON."""

    kind, spec = argv[0], json.loads(argv[1])
    {"pipeline": pipeline_driver, "transport": transport_driver}[kind](spec)
    _emit("RESULT", {"kind": kind})


# -- the benchmark process -------------------------------------------------------------------
def _drive(cluster, kind: str, spec: dict, timeout_s: float) -> dict[str, list[dict]]:
    """Start a driver on a host of its own; its ``KIND {json}`` lines, by kind. Raises with the
    driver's output when it fails or runs past ``timeout_s``."""
    args = [sys.executable, "-c", "import sys; from benchmarks.w7_multihost import driver_main; "
            "driver_main(sys.argv[1:])", kind, json.dumps(spec)]
    proc = cluster.run_driver(args, env={"PYTHONPATH": _root})
    lines: list[str] = []
    records: dict[str, list[dict]] = {}

    def pump():
        for line in proc.stdout:
            lines.append(line)
            head, _, body = line.partition(" ")
            if head in ("RUN", "MOVE", "HOSTS", "RESULT"):
                records.setdefault(head, []).append(json.loads(body))
                print(f"  [{kind} driver] {line.rstrip()[:300]}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join(10)
        raise RuntimeError(f"the {kind} driver did not finish in {timeout_s:.0f} s; its output:\n"
                           + "".join(lines)[-6000:]) from None
    reader.join(30)
    if proc.returncode != 0 or "RESULT" not in records:
        raise RuntimeError(f"the {kind} driver failed (exit {proc.returncode}); its output:\n" + "".join(lines)[-6000:])
    return records


def _prepare(cluster, cfg: W7) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    shared = cluster.shared_dir("w7")
    spec = {"master": cluster.url, "cfg": asdict(cfg), "input": os.path.join(shared, "in"),
            "output": os.path.join(shared, "out"), "shared_blocks": os.path.join(shared, "blocks"),
            "locks": os.path.join(shared, "locks"), "flags": os.path.join(shared, "flags")}
    for key in ("input", "output", "locks", "flags"):
        os.makedirs(spec[key], mode=0o700)
    for task in range(cfg.tasks):
        pq.write_table(pa.table({"id": [task]}), os.path.join(spec["input"], f"f{task:03d}.parquet"))
    return spec


def _best(times: list[float]) -> float | None:
    return min(times) if times else None


def main() -> None:
    args = parse_args(__doc__)
    cfg = QUICK if args.quick else W7()
    sys.path.insert(0, _tests)
    from namespaced_cluster import NamespacedCluster, namespaces_unsupported

    why = namespaces_unsupported()
    if why:
        sys.exit(f"W7 simulates separate hosts with mount namespaces, which this machine cannot: {why}")
    opt = cfg.w1().optimum_s
    order = ["a", "b"] * cfg.repeats
    root = tempfile.mkdtemp(prefix="streambatch-w7-", dir="/var/tmp")  # every host sees /var/tmp
    discovery = os.path.join(root, "discover_gpus.sh")
    with open(discovery, "w") as f:
        f.write(GPU_DISCOVERY)
    os.chmod(discovery, 0o755)
    gpu = {"spark.worker.resource.gpu.amount": "1", "spark.worker.resource.gpu.discoveryScript": discovery}
    cluster = NamespacedCluster(os.path.join(root, "cluster"), workers=2, cores=CORES_PER_WORKER,
                                memory=WORKER_MEMORY, worker_conf={0: gpu, 1: gpu})
    started = time.perf_counter()
    try:
        cluster.start()
        print(f"cluster up in {time.perf_counter() - started:.1f} s: {cluster.url}, 2 workers x "
              f"{CORES_PER_WORKER} slots, 1 pretend GPU each", flush=True)
        spec = {**_prepare(cluster, cfg), "order": order}
        per_run = 25 + opt * 4
        pipeline = _drive(cluster, "pipeline", spec, timeout_s=120 + per_run * len(order))
        transport = _drive(cluster, "transport", spec, timeout_s=600)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    total_s = time.perf_counter() - started

    runs = pipeline["RUN"]
    for r in runs:
        r["over_optimum"] = r["wall_s"] / opt
    mean = {m: sum(r["wall_s"] for r in runs if r["mode"] == m) / cfg.repeats for m in ("a", "b")}
    median = {m: statistics.median(r["wall_s"] for r in runs if r["mode"] == m) for m in ("a", "b")}
    pairs = [a["wall_s"] / b["wall_s"] for a, b in zip(runs[0::2], runs[1::2])]
    moves = transport["MOVE"]
    hosts = transport["HOSTS"][0]
    empty_s = min(next(m for m in moves if m["what"].startswith("empty"))["job_s"])
    where = {hosts["writer"]: "worker that holds it", hosts["other"]: "the other worker", "driver": "driver"}
    for m in moves:
        m["where"] = where.get(m["host"], m["host"])
        m["best_s"] = min(m["job_s"])
        jobless = m["what"].startswith(("engine fetch to the driver", "checksum"))
        # the write's job also makes 128 MiB of random bytes and starts the host agent: only its task time counts
        m["net_s"] = (None if m["what"].startswith("engine write") else
                      m["best_s"] if jobless else max(0.0, m["best_s"] - empty_s))
    figures = {"config": asdict(cfg), "optimum_s": opt, "order": order, "runs": runs,
               "mean_s": mean, "median_s": median, "ratio_a_over_b": mean["a"] / mean["b"],
               "median_ratio_a_over_b": median["a"] / median["b"], "pair_ratios": pairs,
               "moves": moves, "hosts": hosts, "empty_job_s": empty_s, "benchmark_s": total_s,
               "machine": {"cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()}}

    label = {"a": "host-local (default)", "b": "shared block_dir"}
    run_rows = [[f"{r['index'] + 1}", f"({r['mode']}) {label[r['mode']]}", f"{r['wall_s']:.1f}",
                 f"{r['over_optimum']:.2f}x", f"{r['cross_host_bytes'] / MiB:.0f} MiB",
                 f"{r['peak_memory_bytes'] / MiB:.0f} MiB", f"{r['cpu_busy']:.0%}",
                 "yes" if r["exactly_once"] else "NO"] for r in runs]
    block = f"{cfg.block_mib} MiB"

    def gibs(m) -> str:
        moving = not m["what"].startswith(("empty", "checksum", "engine write"))
        return f"{cfg.block_mib / 1024 / m['net_s']:.2f}" if moving and m["net_s"] else ""

    move_rows = [[m["what"], m["where"], f"{m['best_s']:.3f}", ", ".join(f"{t:.3f}" for t in m["job_s"]),
                  f"{min(m['task_s']):.3f}" if m["task_s"] else "",
                  "" if m["net_s"] is None else f"{m['net_s']:.3f}", gibs(m),
                  f"{max(m['moved_bytes']) / MiB:.0f} MiB" if "moved_bytes" in m else "",
                  {True: "yes", False: "NO"}.get(m.get("same"), "")] for m in moves]
    table = (
        f"W7: the W1 pipeline ({cfg.tasks} tasks x {cfg.rows} rows of 1 MiB, {cfg.cpus} CPU + {cfg.gpus} GPU "
        f"slots, memory limit {cfg.memory_limit_mib} MiB) on 2 namespaced workers x {CORES_PER_WORKER} slots, "
        f"{os.cpu_count()} real cores in all; optimum {opt:.1f} s\n\n"
        + markdown_table(["run", "blocks", "wall (s)", "time / optimum", "cross-host bytes", "peak buffered",
                          "machine CPU busy", "every row once"], run_rows)
        + f"\n\nmean (a) {mean['a']:.1f} s = {mean['a'] / opt:.2f}x, mean (b) {mean['b']:.1f} s = "
        f"{mean['b'] / opt:.2f}x; (a)/(b) = {mean['a'] / mean['b']:.3f} of the means, "
        f"{median['a'] / median['b']:.3f} of the medians ({median['a']:.1f} s / {median['b']:.1f} s), per pair "
        + ", ".join(f"{p:.3f}" for p in pairs) + " (target: within 1.15)\n\n"
        + f"Moving one {block} block (Arrow IPC file, binary column of 1 MiB random values). Read = end with a "
        "pa.Table in the reading process and touch every byte (uint64 sum). Each worker read is a one-task Spark "
        "job pinned to its worker; wall = the job as the driver sees it (driver rows: the call), best of "
        f"{cfg.reads}; net = wall - the empty one-task job's; in the task = the task's own clock around the read "
        "(for Spark it starts when Python asks for its input: part of the JVM's fetch can come before)\n\n"
        + markdown_table(["what", "reader", "wall (s)", "all walls (s)", "in the task (s)", "net (s)", "GiB/s net",
                          "bytes moved", "same bytes"], move_rows)
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1, 1.7]})
    colors = {"a": "tab:blue", "b": "tab:orange"}
    left.bar([f"{r['index'] + 1}: ({r['mode']})" for r in runs], [r["over_optimum"] for r in runs],
             color=[colors[r["mode"]] for r in runs], zorder=2)
    left.axhline(1.0, color="black", linewidth=0.8, zorder=3)
    left.set_ylabel("completion time / optimum")
    left.set_title(f"W1 pipeline on 2 hosts: (a) host-local blocks,\n(b) shared block_dir; "
                   f"(a)/(b) = {mean['a'] / mean['b']:.2f}")
    shown = [m for m in moves if not m["what"].startswith(("checksum", "engine write"))]
    right.barh(range(len(shown)), [m["best_s"] for m in shown], zorder=2,
               color=["tab:green" if m["what"].startswith("engine") else "tab:grey" if m["what"].startswith("empty")
                      else "tab:red" for m in shown])
    right.axvline(empty_s, color="black", linestyle="--", linewidth=0.8, zorder=3, label="empty one-task job")
    right.set_yticks(range(len(shown)), [f"{m['what']}\n({m['where']})" for m in shown], fontsize=7)
    right.invert_yaxis()
    right.set_xlabel(f"seconds, best of {cfg.reads} (worker rows: the one-task job's wall)")
    right.set_title(f"moving one {block} block: engine (green) vs Spark block manager (red)")
    right.legend(fontsize=7)
    save(args.out, "w7_multihost" + ("_quick" if args.quick else ""), figures, table, fig)
    print(f"\nW7 took {total_s:.0f} s (cluster start, {len(order)} pipeline runs, block moves, stop)")
    if not all(r["exactly_once"] for r in runs):
        sys.exit("W7: an output did not hold every row exactly once")


if __name__ == "__main__":
    main()
