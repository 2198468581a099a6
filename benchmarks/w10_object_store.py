"""W10: writes to an object store: what a partition's commit costs on S3 against a local disk.

On a local filesystem a partition commits with one directory rename. On S3 there is no
rename (`engine/output/protocols.py`): the commit creates ``p<partition>/_commit.json``
with a conditional create (the commit point), copies each staged file to its final name
server side, then deletes the staging. Measured in one run, against an S3-compatible
server process the benchmark starts itself (``python -m moto.server`` on 127.0.0.1):

* **write time, local vs S3**: the same pipeline (``sb.range(N, override_num_blocks=P)``, a
  cheap ``map_batches`` adding a float column, ``write_parquet``) to a local temporary
  directory and to ``s3://``; the fastest of ``reps`` runs each, alternating which goes
  first, a fresh output path (on S3 a fresh bucket) every run. ``override_num_blocks`` is
  the point here: it sets the number of partitions, i.e. of commits; N is the same at every P.
* **cost per partition** at two values of P, both filesystems: the write's time over P
  (flat: it does not grow with P), and the time inside the driver's commits, from timing
  wrappers installed in this process (where the driver runs) on `PartitionCommitter.commit`,
  the protocol's ``publish`` and `CopyCommit._copy` (copies and staging deletion).
* **requests per partition**: every HTTP request of one more, untimed, S3 write, from moto's
  request recorder (``/moto-api/recorder/...``), by method, CopyObject told from other PUTs
  by its ``x-amz-copy-source`` header; the access log must count the same. One request's
  round trip (a HEAD, a prefix listing) is timed from the driver, in an empty bucket and in
  the bucket the recorded write left: moto lists a prefix by scanning the whole bucket.

Every write must commit N rows in P partitions; the first local run and the recorded S3
run of each P are read back by a plain reader (pyarrow, ``_``-prefixed paths skipped):
ids 0..N-1 once each, P commit records, no staged file left. Anything else exits non-zero.
Spark (``local[2]``) and the S3 server share this machine's cores: loopback moto has
neither real S3's latency nor its throughput.

The S3 server and the reading of its request record are `benchmarks/moto_s3.py`; the other half
of W10, the W4 pipeline writing to S3 as Parquet, Delta and Iceberg, is `benchmarks/w10_pipeline.py`.

    python -m benchmarks.w10_object_store [--quick] [--out DIR]
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from airflow_streambatch.engine.filesystems import resolve

from benchmarks.common import (check, engine_context, markdown_table, parse_args, save, spark_session, subplots,
                               timed, warm_up)
from benchmarks.moto_s3 import (METHODS, MotoServer, method_of, plot_requests_per_partition, purpose_of,
                                request_latency, trace_line)


@dataclass
class W10:
    rows: int = 1_000_000
    sizes: tuple = (200, 2_000)  # partitions (= commits) per write
    reps: int = 3  # timed runs per filesystem and size; the fastest counts
    slots: int = 2


QUICK = W10(rows=100_000, sizes=(50, 200), reps=1)  # a smoke run: one timed run each


def add_score(batch: pa.Table) -> pa.Table:
    """The cheap transform: a float column computed from the id."""
    return batch.append_column("score", pc.multiply(pc.cast(batch["id"], pa.float64()), 0.5))


# -- one write ---------------------------------------------------------------------------
class CommitTimer:
    """Seconds spent inside the driver's commits, by wrappers installed in place on the classes:
    `PartitionCommitter.commit` (the whole commit), the protocol's ``publish`` (on S3: the
    conditional create, the copies and the staging's deletion) and `CopyCommit._copy` (the
    copies and the deletion alone)."""

    PARTS = ("commit", "publish", "copy")

    def __init__(self):
        from airflow_streambatch.engine.output.commit import PartitionCommitter
        from airflow_streambatch.engine.output.protocols import CopyCommit, RenameCommit

        self._lock = threading.Lock()
        self.reset()
        for cls, name, part in ((PartitionCommitter, "commit", "commit"), (RenameCommit, "publish", "publish"),
                                (CopyCommit, "publish", "publish"), (CopyCommit, "_copy", "copy")):
            setattr(cls, name, self._wrap(getattr(cls, name), part))

    def _wrap(self, original, part: str):
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[part] += time.perf_counter() - start
                    self.calls[part] += 1

        return wrapper

    def reset(self) -> None:
        with self._lock:
            self.seconds, self.calls = dict.fromkeys(self.PARTS, 0.0), dict.fromkeys(self.PARTS, 0)


def write(cfg: W10, partitions: int, out: str, timer: CommitTimer) -> dict:
    import airflow_streambatch.engine as sb

    engine_context(resources={"CPU": cfg.slots})
    timer.reset()
    seconds, result = timed(lambda: sb.range(cfg.rows, override_num_blocks=partitions)
                            .map_batches(add_score, batch_format="pyarrow").write_parquet(out))
    check(not result.failed, f"{out}: {len(result.failed)} partition(s) failed: {result.failed[:3]}")
    check(result.rows == cfg.rows and len(result.committed) == partitions,
          f"{out}: {result.rows} rows in {len(result.committed)} partitions, expected {cfg.rows} in {partitions}")
    check(timer.calls["commit"] == partitions, f"{out}: {timer.calls['commit']} commits timed, not {partitions}")
    return {"s": seconds, "commit_s": timer.seconds["commit"], "publish_s": timer.seconds["publish"],
            "copy_s": timer.seconds["copy"], "files": len(result.files)}


def read_back(out: str, cfg: W10, partitions: int) -> None:
    """A plain reader sees ids 0..rows-1 once each; P commit records; no staged file left."""
    fs, root = resolve(out)
    entries = [i for i in fs.get_file_info(pafs.FileSelector(root, recursive=True)) if i.type == pafs.FileType.File]
    relative = [i.path[len(root.rstrip("/")) + 1:] for i in entries]
    records = sum(1 for p in relative if p.endswith("/_commit.json"))
    staged = [p for p in relative if p.startswith("_staging/")]
    check(records == partitions and not staged,
          f"{out}: {records} commit records (expected {partitions}), staged files left: {staged[:3]}")
    ids = pads.dataset(root, filesystem=fs, format="parquet", ignore_prefixes=["_", "."]).to_table(columns=["id"])["id"]
    check(len(ids) == cfg.rows and pc.count_distinct(ids).as_py() == cfg.rows and pc.min(ids).as_py() == 0
          and pc.max(ids).as_py() == cfg.rows - 1, f"{out}: read back {len(ids)} rows, not ids 0..{cfg.rows - 1}")


def measure(cfg: W10, partitions: int, server: MotoServer, work: str, timer: CommitTimer) -> dict:
    runs: dict[str, list[dict]] = {"local": [], "s3": []}
    for rep in range(cfg.reps):  # alternate, so that neither filesystem always runs on a warmer machine
        for fs_name in ("local", "s3") if rep % 2 == 0 else ("s3", "local"):
            out = (f"{work}/local-{partitions}-{rep}" if fs_name == "local"
                   else f"{server.bucket(f'w10-p{partitions}-r{rep}')}/out")
            runs[fs_name].append(write(cfg, partitions, out, timer))
            if fs_name == "local":
                if rep == 0:
                    read_back(out, cfg, partitions)
                shutil.rmtree(out)
        print(f"  P={partitions} rep {rep}: local {runs['local'][-1]['s']:.2f} s, S3 {runs['s3'][-1]['s']:.2f} s",
              flush=True)
    bucket = server.bucket(f"w10-p{partitions}-recorded")
    recorded_run, recorded, logged = server.record(lambda: write(cfg, partitions, f"{bucket}/out", timer))
    read_back(f"{bucket}/out", cfg, partitions)
    as_logged = Counter(m for m, _, _ in logged)
    check(Counter(e["method"] for e in recorded) == as_logged,
          f"the recorder saw {len(recorded)} requests, the access log {len(logged)} ({dict(as_logged)})")
    methods = Counter(method_of(e) for e in recorded)
    row = {"partitions": partitions, "rows": cfg.rows, "files": recorded_run["files"], "requests": len(recorded),
           "requests_logged": len(logged), "by_method": {m: methods.get(m, 0) for m in METHODS},
           "by_purpose": dict(Counter(purpose_of(e) for e in recorded).most_common()),
           "by_status": dict(Counter(str(s) for _, _, s in logged).most_common()),
           "recorded_run_s": recorded_run["s"], "recorded_commit_s": recorded_run["commit_s"],
           "partition_1_requests": [trace_line(e) for e in recorded if "p00001" in e["url"]],
           "latency_after": request_latency(server, bucket)}
    for fs_name, values in runs.items():
        best = min(values, key=lambda r: r["s"])
        row[f"{fs_name}_s"], row[f"{fs_name}_commit_s"] = best["s"], best["commit_s"]
        row[f"{fs_name}_runs_s"] = [r["s"] for r in values]
        row[f"{fs_name}_commit_runs_s"] = [r["commit_s"] for r in values]
        row[f"{fs_name}_ms_per_partition"] = 1000 * best["s"] / partitions
        row[f"{fs_name}_commit_ms_per_partition"] = 1000 * best["commit_s"] / partitions
        row[f"{fs_name}_publish_ms_per_partition"] = 1000 * best["publish_s"] / partitions
        row[f"{fs_name}_copy_ms_per_partition"] = 1000 * best["copy_s"] / partitions
    row["ratio"] = row["s3_s"] / row["local_s"]
    return row


def main() -> None:
    args = parse_args(__doc__)
    cfg = QUICK if args.quick else W10()
    work = tempfile.mkdtemp(prefix="streambatch-w10-")
    server = MotoServer(work)  # first: sets the AWS variables Spark's workers inherit
    runs = []
    try:
        spark_session(cfg.slots)
        warm_up(cfg.slots)
        timer = CommitTimer()
        for out in (f"{work}/warm", f"{server.bucket('w10-warm')}/out"):  # each worker's first S3 client, untimed
            write(W10(rows=1_000), cfg.slots * 2, out, timer)
        latency = request_latency(server, server.bucket("w10-probe"))
        print(f"one S3 request from the driver, empty bucket: HEAD {latency['head_ms']:.2f} ms, "
              f"prefix list {latency['list_ms']:.2f} ms", flush=True)
        for partitions in cfg.sizes:
            runs.append(measure(cfg, partitions, server, work, timer))
            r, after = runs[-1], runs[-1]["latency_after"]
            print(f"P={partitions}: local {r['local_s']:.2f} s, S3 {r['s3_s']:.2f} s ({r['ratio']:.1f}x); "
                  f"{r['requests'] / partitions:.1f} S3 requests per partition; in a bucket of "
                  f"{after['keys_in_bucket']:,} keys HEAD {after['head_ms']:.2f} ms, list {after['list_ms']:.2f} ms",
                  flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(args, cfg, runs, latency)


def report(args, cfg: W10, runs: list[dict], latency: dict) -> None:
    small, large = runs[0], runs[-1]
    growth = (large["requests"] - small["requests"]) / (large["partitions"] - small["partitions"])
    flat = {fs_name: large[f"{fs_name}_ms_per_partition"] / small[f"{fs_name}_ms_per_partition"]
            for fs_name in ("local", "s3")}
    create = large["s3_publish_ms_per_partition"] - large["s3_copy_ms_per_partition"]
    rest = large["s3_commit_ms_per_partition"] - large["s3_publish_ms_per_partition"]
    after = large["latency_after"]
    rows = [[f"{r['partitions']:,}", f"{r['local_s']:.2f}", f"{r['s3_s']:.2f}", f"{r['ratio']:.1f}x",
             f"{r['local_ms_per_partition']:.1f} / {r['s3_ms_per_partition']:.1f}",
             f"{r['local_commit_s']:.2f} / {r['s3_commit_s']:.2f}",
             f"{r['local_commit_ms_per_partition']:.2f} / {r['s3_commit_ms_per_partition']:.2f}",
             f"{r['requests'] / r['partitions']:.1f}",
             " / ".join(f"{r['by_method'][m] / r['partitions']:.1f}" for m in METHODS)] for r in runs]
    table = (f"W10: `write_parquet` of {cfg.rows:,} rows (`sb.range` + a `map_batches` adding a float column) to a "
             f"local directory and to S3 (moto's server on 127.0.0.1), {cfg.slots} slots; "
             f"`override_num_blocks=P` sets the partitions, i.e. the commits (the knob this benchmark varies); "
             + ("one run each" if cfg.reps == 1 else f"the fastest of {cfg.reps} runs each")
             + "; requests from one more, recorded, S3 write\n\n"
             + markdown_table(["partitions P", "local (s)", "S3 (s)", "S3 / local", "write ms/partition local / S3",
                               "in commits (s) local / S3", "commit ms/partition local / S3",
                               "S3 requests/partition", "PUT / COPY / POST / GET / HEAD / DELETE per partition"],
                              rows)
             + f"\n\nWrite time per partition at {large['partitions']:,} vs {small['partitions']:,} partitions: "
               f"local {flat['local']:.2f}x, S3 {flat['s3']:.2f}x; each partition more adds {growth:.1f} S3 "
               f"requests. COPY is a PUT with `x-amz-copy-source` (CopyObject); POST is multipart upload start and "
               f"complete, and DeleteObjects. Inside an S3 commit at {large['partitions']:,} partitions: "
               f"{create:.1f} ms in the conditional create of `_commit.json`, {large['s3_copy_ms_per_partition']:.1f} "
               f"ms in the copies and the staging's deletion, {rest:.1f} ms around them. One request from the "
               f"driver (median): HEAD {latency['head_ms']:.1f} ms and a prefix listing {latency['list_ms']:.1f} ms "
               f"in an empty bucket; HEAD {after['head_ms']:.1f} ms and listing {after['list_ms']:.1f} ms in the "
               f"bucket a {large['partitions']:,}-partition write leaves ({after['keys_in_bucket']:,} keys).")

    xs = [r["partitions"] for r in runs]
    fig, (left, right) = subplots(2, figsize=(11, 4))
    for fs_name, label, color in (("local", "local", "C0"), ("s3", "S3 (moto)", "C3")):
        left.plot(xs, [r[f"{fs_name}_ms_per_partition"] for r in runs], marker="o", color=color,
                  label=f"{label}: write time / P")
        left.plot(xs, [max(r[f"{fs_name}_commit_ms_per_partition"], 1e-3) for r in runs], marker="s", color=color,
                  linestyle="--", label=f"{label}: inside commit / P")
    left.set(xscale="log", yscale="log", xlabel="partitions (commits) per write", ylabel="ms per partition")
    left.set_xticks(xs, [f"{x:,}" for x in xs], minor=False)
    left.minorticks_off()
    left.legend(fontsize="small")
    plot_requests_per_partition(right, [f"P={x:,}" for x in xs], runs)
    fig.suptitle("W10 object store: write cost per partition, local vs S3, and S3 requests")
    save(args.out, "w10_object_store" + ("_quick" if args.quick else ""),
         {"config": asdict(cfg), "runs": runs, "flatness": flat, "requests_per_added_partition": growth,
          "request_latency": latency}, table, fig)


if __name__ == "__main__":
    main()
