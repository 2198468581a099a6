"""Shared benchmark plumbing: one Spark session, simulated slots, tables, plots, JSON.

Machines here have 2 cores, so sleep-based workloads simulate more execution slots
than cores (as the paper does with simulated GPU slots). Our engine enforces slots
in its scheduler; the plain-Spark baselines get the same limits from `slot`, a
cross-process semaphore made of lock files, so every system sees the same 4 CPU and
2 GPU slots inside one Spark application.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import socket
import sys
import tempfile
import threading
import time

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# workers import the workload functions from this package
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_root, os.environ.get("PYTHONPATH", "")) if p)

MiB = 1 << 20


def parse_args(description: str, extra: dict[str, dict] | None = None) -> argparse.Namespace:
    """``--quick`` and ``--out``, plus the benchmark's own flags (``extra``: flag -> add_argument kwargs)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="small sizes for a CI smoke run (< 1 minute)")
    parser.add_argument("--out", default=os.path.join(_root, "benchmarks", "out"), help="where PNG/JSON go")
    for flag, kwargs in (extra or {}).items():
        parser.add_argument(flag, **kwargs)
    return parser.parse_args()


def spark_session(task_slots: int, driver_memory: str = "4g", conf: dict | None = None):
    from pyspark.sql import SparkSession

    from airflow_streambatch.engine.spark.session import with_spark_defaults

    builder = (
        SparkSession.builder.master(f"local[{task_slots}]")
        .appName("streambatch-benchmarks")
        .config(map=with_spark_defaults({"spark.driver.memory": driver_memory, **(conf or {})}))
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextlib.contextmanager
def connect_session(task_slots: int, driver_memory: str = "4g", conf: dict | None = None):
    """A Spark Connect client of a new server process (``local[task_slots]``, `spark_session`'s settings),
    for the block."""
    from pyspark.sql.connect.session import SparkSession

    from airflow_streambatch.engine.spark.connect_server import start_connect_server, stop_connect_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.NamedTemporaryFile(prefix="streambatch-connect-", suffix=".log") as log:
        server = start_connect_server(f"local[{task_slots}]", port, log,
                                      {"spark.driver.memory": driver_memory, **(conf or {})})
        session = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").create()
        try:
            yield session
        finally:
            session.stop()
            stop_connect_server(server)


def lock_dir() -> str:
    return tempfile.mkdtemp(prefix="streambatch-slots-")


@contextlib.contextmanager
def slot(directory: str, kind: str, count: int):
    """Hold one of ``count`` ``kind`` slots, across processes (fcntl locks on files)."""
    while True:
        for i in range(count):
            handle = open(os.path.join(directory, f"{kind}-{i}"), "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        time.sleep(0.002)


class Failed(RuntimeError):
    """A run or its read-back did not give what it must: the benchmark exits non-zero."""


def check(ok: bool, message: str) -> None:
    if not ok:
        raise Failed(message)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def markdown_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def subplots(ncols: int, figsize: tuple[float, float]):
    """(figure, axes) of ``ncols`` plots side by side, drawn off-screen (matplotlib's Agg), for `save`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=figsize)


def save(out_dir: str, name: str, figures: dict, table: str, fig) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(figures, f, indent=2, default=str)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(table + "\n")
    fig.savefig(os.path.join(out_dir, f"{name}.png"), dpi=110, bbox_inches="tight")
    print(table)
    print(f"\nwrote {out_dir}/{name}.png, .json, .md")


class PeakMemory:
    """Peak memory of this process and all its descendants (Spark's JVM and Python workers, Ray's
    processes), sampled every ``interval_s``: their summed RSS, or with ``kind="pss"`` their
    proportional set size (pages shared by forked workers counted once), plus the bytes of
    files under ``tmpfs_dir`` (our blocks live in tmpfs, which is memory that no process's
    RSS shows). ``processes=False`` measures the tmpfs files alone."""

    def __init__(self, tmpfs_dir: str | None = None, interval_s: float = 0.1, kind: str = "rss",
                 processes: bool = True):
        self.tmpfs_dir = tmpfs_dir
        self.interval_s = interval_s
        self.kind = kind
        self.processes = processes
        self.peak = 0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> int:
        import psutil

        root = psutil.Process()
        total = 0
        family = [root, *root.children(recursive=True)] if self.processes else []
        self.peak_processes = max(self.peak_processes, len(family))
        for proc in family:
            try:
                total += proc.memory_full_info().pss if self.kind == "pss" else proc.memory_info().rss
            except psutil.Error:
                pass
        if self.tmpfs_dir:
            for folder, _, files in os.walk(self.tmpfs_dir):
                for name in files:
                    try:
                        total += os.path.getsize(os.path.join(folder, name))
                    except OSError:
                        pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sample())
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


_engine_scope = contextlib.ExitStack()  # holds the current run's `DataContext.scoped`


def engine_context(**settings):
    """A fresh DataContext, installed as current, for one benchmark run."""
    from airflow_streambatch.engine import DataContext

    ctx = DataContext(progress_interval_s=0, **settings)
    _engine_scope.close()  # the previous run's context stops being current
    return _engine_scope.enter_context(ctx.scoped())


def warm_up(task_slots: int) -> None:
    """Start every Python worker and import the engine in it once, so that the first
    system measured does not pay the process start-up the others then reuse."""
    import airflow_streambatch.engine as sb

    engine_context(resources={"CPU": task_slots})
    sb.range(task_slots * 4, override_num_blocks=task_slots * 4).map_batches(_identity, num_cpus=0.5,
                                                                             batch_format="pyarrow").count()


def _identity(batch):
    return batch
