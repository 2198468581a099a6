"""W6: recovery cost (paper 5.1.3, figure 6c) on a real standalone cluster.

A master and two workers (2 cores each) run a read -> transform -> write_parquet
pipeline three ways: fault-free; with one executor killed (SIGKILL) once a third of
the partitions are committed; and "restart": the driver itself is killed at the
same point and the job is started again, resuming from the committed partitions
(what a batch system without lineage recovery does). Reports total time, the
throughput over time (committed rows per second), and checks that every output
holds each row exactly once.

    python -m benchmarks.w6_recovery [--quick]
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import markdown_table, parse_args, save

_tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
sys.path.insert(0, _tests)
from standalone_cluster import StandaloneCluster  # noqa: E402

JOB = os.path.join(_tests, "engine", "cluster_job.py")


@dataclass
class W6:
    files: int = 24  # one input partition per file
    rows_per_file: int = 200
    task_s: float = 2.0
    kill_after_fraction: float = 1 / 3


QUICK = W6(rows_per_file=50, task_s=0.5)


def _launch(cluster, work: str, sleep_s: float) -> subprocess.Popen:
    args = [sys.executable, JOB, cluster.url, f"{work}/in", f"{work}/out", f"{work}/blocks", f"{work}/markers",
            "none", str(sleep_s)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _commit_records(work: str) -> list[str]:
    return glob.glob(f"{work}/out/p*/_commit.json")


def _commits(work: str) -> int:
    return len(_commit_records(work))


def _wait_commits(work: str, n: int, proc: subprocess.Popen) -> None:
    while _commits(work) < n and proc.poll() is None:
        time.sleep(0.05)


def _timeline(work: str, start: float) -> list[tuple[float, int]]:
    """(seconds since start, rows committed so far), from the commit records."""
    records = []
    for name in _commit_records(work):
        with open(name) as f:
            rec = json.load(f)
        records.append((rec["committed_at"] - start, rec["rows"]))
    points, total = [(0.0, 0)], 0
    for t, rows in sorted(records):
        total += rows
        points.append((t, total))
    return points


def _check_exactly_once(work: str, cfg: W6) -> bool:
    ids = sorted(pq.read_table(f"{work}/out")["id"].to_pylist())
    return ids == list(range(cfg.files * cfg.rows_per_file))


def run(cluster, cfg: W6, scenario: str, root: str) -> dict:
    work = os.path.join(root, scenario)
    os.makedirs(f"{work}/in")
    os.makedirs(f"{work}/markers")
    for f in range(cfg.files):
        ids = list(range(f * cfg.rows_per_file, (f + 1) * cfg.rows_per_file))
        pq.write_table(pa.table({"id": ids}), f"{work}/in/f{f:03d}.parquet")
    kill_at = max(1, int(cfg.files * cfg.kill_after_fraction))
    start = time.time()
    proc = _launch(cluster, work, cfg.task_s)
    if scenario == "executor-killed":
        _wait_commits(work, kill_at, proc)
        os.kill(cluster.executor_pids()[0], 9)
    elif scenario == "restart":
        _wait_commits(work, kill_at, proc)
        proc.kill()  # the driver dies; a new application resumes from the commit records
        proc.wait()
        proc = _launch(cluster, work, cfg.task_s)
    out, _ = proc.communicate(timeout=600)
    wall = time.time() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{scenario} job failed:\n{out[-3000:]}")
    timeline = _timeline(work, start)
    recovery = [line for line in out.splitlines() if "WARNING" in line or "lost" in line]
    for line in recovery:
        print(f"  {scenario}: {line}", flush=True)
    return {"scenario": scenario, "wall_s": wall, "timeline": timeline, "first_commit_s": timeline[1][0],
            "exactly_once": _check_exactly_once(work, cfg), "driver_warnings": recovery}


def main() -> None:
    args = parse_args(__doc__)
    cfg = QUICK if args.quick else W6()
    root = tempfile.mkdtemp(prefix="streambatch-w6-")
    cluster = StandaloneCluster(os.path.join(root, "cluster")).start()
    try:
        runs = [run(cluster, cfg, s, root) for s in ("fault-free", "executor-killed", "restart")]
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    base, first = runs[0]["wall_s"], runs[0]["first_commit_s"]
    rows = [[r["scenario"], f"{r['wall_s']:.1f}", f"{r['wall_s'] / base:.2f}x", f"{r['first_commit_s']:.1f}",
             f"{(r['wall_s'] - r['first_commit_s']) / (base - first):.2f}x", "yes" if r["exactly_once"] else "NO"]
            for r in runs]
    table = (f"W6: {cfg.files} partitions x {cfg.rows_per_file} rows, {cfg.task_s} s per task, standalone cluster "
             "of 2 workers x 2 cores; times include the Spark application's start\n\n"
             + markdown_table(["run", "total (s)", "vs fault-free", "first commit (s)",
                               "vs fault-free, from the first commit", "every row exactly once"], rows))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        ts, totals = zip(*r["timeline"])
        ax.step(ts, totals, where="post", label=r["scenario"])
    ax.set_xlabel("seconds since the job was launched")
    ax.set_ylabel("rows committed")
    ax.set_title("W6 recovery: committed output over time")
    ax.legend()
    figures = {"config": asdict(cfg), "runs": runs}
    save(args.out, "w6_recovery" + ("_quick" if args.quick else ""), figures, table, fig)
    if not all(r["exactly_once"] for r in runs):
        sys.exit("W6: an output did not hold every row exactly once")


if __name__ == "__main__":
    main()
