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
import uuid
from dataclasses import asdict, dataclass
from functools import partial

from benchmarks.common import MiB, markdown_table, parse_args, save, slot
from benchmarks.w1_memory import W1, inference, load, transform

_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_tests = os.path.join(_root, "tests")

CORES_PER_WORKER = 4  # 8 Spark task slots in all, as W1's local[cpus + gpus + 2]; the machine has 2 real cores
WORKER_MEMORY = "2g"
GPU_DISCOVERY = '#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0"]}\'\n'  # one pretend GPU per worker


@dataclass
class W7:
    tasks: int = 48  # W1's full size: optimum 36 s
    rows: int = 40
    load_s: float = 1.0
    row_s: float = 0.05
    batch_rows: int = 20
    batch_s: float = 0.1
    cpus: int = 4
    gpus: int = 2  # one pretend GPU per worker
    memory_limit_mib: int = 512  # W1 sweeps its memory limit; W7 runs at one of W1's points
    repeats: int = 3  # (a, b) pairs, alternated
    block_mib: int = 128
    reads: int = 3  # best of

    def w1(self) -> W1:
        return W1(tasks=self.tasks, rows=self.rows, load_s=self.load_s, row_s=self.row_s,
                  batch_rows=self.batch_rows, batch_s=self.batch_s, cpus=self.cpus, gpus=self.gpus)


QUICK = W7(tasks=16, rows=20, repeats=1, block_mib=16)


# -- executed on the hosts (module-level: Spark workers import them from this module) -----------
def gpu_inference(batch, cfg: W1, locks: str):
    """W1's inference, holding one of the ``gpus`` lock-file slots (in a directory every host sees)
    besides the GPU Spark assigned the task."""
    with slot(locks, "gpu", cfg.gpus):
        return inference(batch, cfg)


def _namespace() -> str:
    return os.readlink("/proc/self/ns/mnt")


def checksum(table) -> int:
    """Touch every byte of every buffer of ``table``: a wrapping uint64 sum (the 0-7 byte tail of a
    buffer is summed bytewise)."""
    import numpy as np

    total = 0
    for column in table.columns:
        for chunk in column.chunks:
            for buf in chunk.buffers():
                if buf is None or buf.size == 0:
                    continue
                words = buf.size // 8
                total += int(np.frombuffer(buf, dtype=np.uint64, count=words).sum())
                total += int(np.frombuffer(buf, dtype=np.uint8, offset=words * 8).sum())
    return total & 0xFFFFFFFFFFFFFFFF


def block_table(nbytes: int):
    """One block as a pipeline would write it: a binary column of 1 MiB random values."""
    import pyarrow as pa

    return pa.table({"data": pa.array([os.urandom(MiB) for _ in range(max(1, nbytes // MiB))], pa.binary())})


def ipc_bytes(_seed, nbytes: int) -> bytes:
    """The same kind of block as Arrow IPC file bytes (what Spark's block manager gets to hold)."""
    import pyarrow as pa

    table = block_table(nbytes)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def write_engine_block(control, run_id: str, nbytes: int, _iterator):
    """A task: start this host's agent as an engine task does, create the run's directory here,
    write one block with the engine's `write_block`."""
    from airflow_streambatch.engine.context import DataContext
    from airflow_streambatch.engine.worker.blocks import write_block
    from airflow_streambatch.engine.worker.host_agent import ensure_agent, prepare_run_dir

    block_dir = DataContext().block_dir  # the default: /dev/shm/streambatch-<uid> of this host
    agent = ensure_agent(block_dir, control)
    run_dir = os.path.join(block_dir, f"run-{run_id}")
    prepare_run_dir(run_dir, agent["mark"])
    table = block_table(nbytes)
    path = os.path.join(run_dir, "w7-0.arrow")
    start = time.perf_counter()
    write_block(table, path)
    yield {"path": path, "location": agent["uri"], "num_rows": table.num_rows, "size_bytes": table.nbytes,
           "file_bytes": os.path.getsize(path), "time_s": time.perf_counter() - start, "namespace": _namespace(),
           "checksum": checksum(table)}


def engine_read(ref, control, _iterator):
    """A task: `transport.read_any` (a memory map where the file is, else a Flight fetch from the
    host agent that serves it), then `checksum`."""
    from airflow_streambatch.engine.worker.transport import read_any

    start = time.perf_counter()
    table, moved = read_any(ref, control)
    total = checksum(table)
    yield {"time_s": time.perf_counter() - start, "moved_bytes": moved, "checksum": total,
           "namespace": _namespace()}


def spark_cached_read(iterator):
    """A task over the cached partition: receive the IPC bytes, open them as a table, checksum.
    Its clock starts when Python asks for its input, which can be after the JVM fetched it."""
    import pyarrow as pa

    start = time.perf_counter()
    total, nbytes = None, 0
    for blob in iterator:
        table = pa.ipc.open_file(pa.py_buffer(blob)).read_all()
        total, nbytes = checksum(table), len(blob)
    yield {"time_s": time.perf_counter() - start, "checksum": total, "bytes": nbytes, "namespace": _namespace()}


def empty_task(_iterator):
    yield {"time_s": 0.0, "namespace": _namespace()}


def _barrier_hold(target: str, flags: str, tag: str, _iterator):
    """A barrier task (every slot of the cluster runs one at once): on ``target`` it holds its slot
    until ``flags/release-<tag>`` appears, elsewhere it ends at once."""
    if _namespace() == target:
        with open(os.path.join(flags, f"held-{tag}-{os.getpid()}-{uuid.uuid4().hex[:6]}"), "w"):
            pass
        deadline = time.monotonic() + 300
        while not os.path.exists(os.path.join(flags, f"release-{tag}")) and time.monotonic() < deadline:
            time.sleep(0.01)
    yield _namespace()


def _warm_imports(_iterator):
    """Every Python worker imports what the timed tasks use, so no timed job pays an import."""
    import numpy  # noqa: F401
    import pyarrow.flight  # noqa: F401
    import pyarrow.ipc  # noqa: F401

    import airflow_streambatch.engine.worker.host_agent  # noqa: F401
    import airflow_streambatch.engine.worker.transport  # noqa: F401

    yield _namespace()


def _warm_read(ref, control, _iterator):
    """Every Python worker reads the block once, untimed: its Flight client is connected to the
    agent (one per process, as in a pipeline's long-lived workers)."""
    from airflow_streambatch.engine.worker.transport import read_any

    table, _ = read_any(ref, control)
    checksum(table)
    yield _namespace()


def _discover(_iterator):
    from pyspark import BarrierTaskContext

    yield BarrierTaskContext.get().allGather(_namespace())


class Pinned:
    """Runs a one-task job on one worker: every slot of the other worker is held by a barrier job
    meanwhile, so the task can only start on the free one (``spark.locality.wait=0``: a task whose
    cached input lives on the held worker does not wait for it)."""

    def __init__(self, sc, hosts: list[str], flags: str):
        self.sc, self.hosts, self.flags, self.count = sc, hosts, flags, 0

    def _barrier(self, fn, description: str):
        self.sc.setJobDescription(description)
        slots = CORES_PER_WORKER * len(self.hosts)
        return self.sc.parallelize(range(slots), slots).barrier().mapPartitions(fn).collect()

    def _active_tasks(self) -> str:
        tracker = self.sc.statusTracker()
        stages = [tracker.getStageInfo(i) for i in tracker.getActiveStageIds()]
        return "active stages: " + ", ".join(f"{s.name} ({s.numActiveTasks} running, {s.numCompletedTasks} done "
                                             f"of {s.numTasks})" for s in stages if s)

    def run(self, host: str, fn, rdd=None) -> tuple[dict, float]:
        """``fn`` over ``rdd`` (default: one dummy partition) on ``host``: (its one result, job wall s)."""
        for _ in range(5):
            self.count += 1
            tag = f"t{self.count}"
            others = [h for h in self.hosts if h != host]
            errors: list[BaseException] = []

            def hold_slots(target: str, tag: str = tag, errors: list = errors) -> None:
                try:
                    self._barrier(partial(_barrier_hold, target, self.flags, tag), f"w7 hold {tag}")
                except BaseException as exc:  # noqa: BLE001 - reported by the waiting thread
                    errors.append(exc)

            holds = [threading.Thread(target=hold_slots, args=(h,)) for h in others[:1]]
            for hold in holds:
                hold.start()
            try:
                deadline = time.monotonic() + 60
                while sum(n.startswith(f"held-{tag}-") for n in os.listdir(self.flags)) < CORES_PER_WORKER:
                    if errors:
                        raise RuntimeError(f"holding the other worker's slots failed: {errors[0]!r}")
                    if time.monotonic() > deadline:
                        raise RuntimeError("the other worker's slots were not all held within 60 s "
                                           f"({self._active_tasks()})")
                    time.sleep(0.01)
                self.sc.setJobDescription(f"w7 {tag}")
                source = rdd if rdd is not None else self.sc.parallelize([0], 1)
                start = time.perf_counter()
                got = source.mapPartitions(fn).collect()[0]
                job_s = time.perf_counter() - start
            finally:
                open(os.path.join(self.flags, f"release-{tag}"), "w").close()
                for hold in holds:
                    hold.join()
            if got["namespace"] == host:
                return got, job_s
        raise RuntimeError(f"a task meant for {host} kept running elsewhere ({got['namespace']})")


# -- the drivers (each a process on its own host, started by `NamespacedCluster.run_driver`) -------
def _session(spec: dict, name: str, conf: dict[str, str]):
    from pyspark.sql import SparkSession

    from airflow_streambatch.engine.spark.session import with_spark_defaults

    slots = CORES_PER_WORKER * 2
    spark = (
        SparkSession.builder.master(spec["master"]).appName(f"streambatch-w7-{name}")
        .config("spark.executor.cores", str(CORES_PER_WORKER)).config("spark.cores.max", str(slots))
        .config("spark.pyspark.python", sys.executable).config("spark.executorEnv.PYTHONPATH", _root)
        .config(map=with_spark_defaults({"spark.ui.enabled": "false", **conf}))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sc, deadline = spark.sparkContext, time.monotonic() + 120
    while sc._jsc.sc().getExecutorMemoryStatus().size() < 3:  # the driver's block manager and 2 executors
        if time.monotonic() > deadline:
            raise RuntimeError("the two executors did not register within 120 s")
        time.sleep(0.2)
    return spark


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the machine so far (/proc/stat; every namespace sees the same)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def _emit(kind: str, payload: dict) -> None:
    print(f"{kind} " + json.dumps(payload), flush=True)


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
            sb.read_parquet(spec["input"], override_num_blocks=cfg.tasks)
            .flat_map(partial(load, cfg=w1))
            .map(partial(transform, cfg=w1))
            .map_batches(partial(gpu_inference, cfg=w1, locks=spec["locks"]), batch_size=w1.batch_rows, num_gpus=1)
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


def transport_driver(spec: dict) -> None:
    """Moving one block; prints ``MOVE {json}`` per method: the best-of-``reads`` inputs."""
    import pyarrow as pa
    from pyspark import StorageLevel

    from airflow_streambatch.engine.execution.control_server import control_server
    from airflow_streambatch.engine.worker.blocks import BlockRef
    from airflow_streambatch.engine.worker.transport import read_any

    cfg = W7(**spec["cfg"])
    nbytes = cfg.block_mib * MiB
    spark = _session(spec, "transport", {"spark.executor.memory": "1536m", "spark.driver.memory": "2g",
                                         # no delay scheduling: a task whose cached input's executor is held
                                         # runs at once on the other one (the cross-host read below)
                                         "spark.locality.wait": "0"})
    sc = spark.sparkContext
    slots = CORES_PER_WORKER * 2
    hosts = sorted(set(sc.parallelize(range(slots), slots).barrier().mapPartitions(_discover).collect()[0]))
    assert len(hosts) == 2, hosts
    pinned = Pinned(sc, hosts, spec["flags"])
    pinned._barrier(_warm_imports, "w7 warm imports")

    def repeat(what: str, host: str, fn, rdd=None, expect: int | None = None) -> dict:
        rows = [pinned.run(host, fn, rdd) for _ in range(cfg.reads)]
        record = {"what": what, "host": host, "job_s": [job for _, job in rows],
                  "task_s": [got["time_s"] for got, _ in rows]}
        if "moved_bytes" in rows[0][0]:
            record["moved_bytes"] = [got["moved_bytes"] for got, _ in rows]
        if expect is not None:
            record["same"] = all(got["checksum"] == expect for got, _ in rows)
        _emit("MOVE", record)
        return record

    # Spark's block manager first: where the partition is cached decides the "writer" host for both
    cached = sc.parallelize([0], 1).map(partial(ipc_bytes, nbytes=nbytes)).persist(StorageLevel.MEMORY_ONLY)
    first = cached.mapPartitions(spark_cached_read).collect()[0]  # computes and caches it
    writer = first["namespace"]
    other = [h for h in hosts if h != writer][0]
    info = [(r.numCachedPartitions(), r.memSize()) for r in sc._jsc.sc().getRDDStorageInfo() if r.id() == cached.id()]
    _emit("HOSTS", {"workers": hosts, "writer": writer, "other": other, "driver": _namespace(),
                    "spark_cached": info, "ipc_bytes": first["bytes"]})
    if not info or info[0][0] != 1:
        raise RuntimeError(f"the partition was not cached: {info}")
    repeat("empty one-task job", other, empty_task)
    repeat("spark block manager: local read", writer, spark_cached_read, cached, expect=first["checksum"])
    repeat("spark block manager: cross-host read", other, spark_cached_read, cached, expect=first["checksum"])
    times, same = [], True
    for _ in range(cfg.reads):
        start = time.perf_counter()
        blob = cached.collect()[0]
        same = same and checksum(pa.ipc.open_file(pa.py_buffer(blob)).read_all()) == first["checksum"]
        times.append(time.perf_counter() - start)
        del blob
    _emit("MOVE", {"what": "spark collect to the driver", "host": "driver", "job_s": times, "task_s": [],
                   "same": same})
    cached.unpersist()

    # the engine: one block on the same host, served by that host's agent
    server = control_server(spark)
    control = server.info(timeout_s=60)
    run_id = f"w7{uuid.uuid4().hex[:10]}"
    server.start_run(run_id)  # agents keep the run's directory while it is live
    written, job_s = pinned.run(writer, partial(write_engine_block, control, run_id, nbytes))
    _emit("MOVE", {"what": "engine write_block", "host": writer, "job_s": [job_s], "task_s": [written["time_s"]],
                   "file_bytes": written["file_bytes"]})
    ref = BlockRef(block_id="w7-0", path=written["path"], num_rows=written["num_rows"],
                   size_bytes=written["size_bytes"], producer=("w7", "0", 0), partitions=(0,),
                   location=written["location"])
    pinned._barrier(partial(_warm_read, ref, control), "w7 warm reads")
    repeat("engine: local read (memory map)", writer, partial(engine_read, ref, control), expect=written["checksum"])
    repeat("engine: cross-host read (host agent, Flight)", other, partial(engine_read, ref, control),
           expect=written["checksum"])
    times, moved, same = [], [], True
    for _ in range(cfg.reads):
        start = time.perf_counter()
        table, n = read_any(ref, control)
        same = same and checksum(table) == written["checksum"]
        times.append(time.perf_counter() - start)
        moved.append(n)
        del table
    _emit("MOVE", {"what": "engine fetch to the driver (host agent, Flight)", "host": "driver", "job_s": times,
                   "task_s": times, "moved_bytes": moved, "same": same})
    server.end_run(run_id)  # the agent removes the block

    table, times = block_table(nbytes), []
    for _ in range(cfg.reads):
        start = time.perf_counter()
        checksum(table)
        times.append(time.perf_counter() - start)
    _emit("MOVE", {"what": "checksum alone (table in memory, driver)", "host": "driver", "job_s": times,
                   "task_s": times})
    spark.stop()


def driver_main(argv: list[str]) -> None:
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
