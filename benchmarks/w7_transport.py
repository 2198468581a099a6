"""W7's second part: moving one block between hosts, the engine against Spark's block manager.

It is a module apart from `benchmarks.w7_multihost` (the entry point: the config, the W1 pipeline's
driver, the benchmark process and its report) because it is a benchmark of its own: one 128 MiB
block (a binary column of random bytes as an Arrow IPC file) written on one worker and read on that
worker, on the other one and on the driver, by the engine (`transport.read_any`: a memory map, or a
Flight fetch from the writer's host agent) and through Spark's block manager (one ``MEMORY_ONLY``
RDD partition). What it measures and how is in `benchmarks.w7_multihost`'s docstring. Here: the
functions Spark runs on the hosts for it (module-level: workers import them from this module by
reference), `Pinned` (a one-task job on a chosen worker) and `transport_driver`, the driver process
that ``w7_multihost.driver_main(["transport", spec])`` runs on a host of its own.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from functools import partial

from benchmarks.common import MiB
from benchmarks.w7_hosts import CORES_PER_WORKER, W7, _emit, _session


# -- executed on the hosts (module-level: Spark workers import them from this module) -----------
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


# -- the driver (a process on its own host, started by `w7_multihost.driver_main`) ---------------
def transport_driver(spec: dict) -> None:
    """Moving one block; prints ``MOVE {json}`` per method: the best-of-``reads`` inputs."""
    import pyarrow as pa
    from pyspark import StorageLevel

    from airflow_streambatch.engine.execution.control_server import control_server
    from airflow_streambatch.engine.protocol.blocks import BlockRef
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
