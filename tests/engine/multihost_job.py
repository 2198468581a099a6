"""A driver run against a cluster whose hosts share no /tmp or /dev/shm (`namespaced_cluster.py`),
with engine defaults (no block directory set). Prints one ``RESULT {json}`` line.

    python multihost_job.py MASTER INPUT OUTPUT MODE [SLEEP_S]

MODE: ``write`` (read -> map_batches -> map_batches(concurrency=1) -> write_parquet, with
small blocks and a small memory limit, so tasks stream blocks and wait for grants),
``take_all``, ``iter_batches``, ``materialize`` (one materialized dataset read twice),
``pieces`` (one file, so one read task, then the second operator as a model of four copies:
its blocks are cut into pieces for the idle slots of both hosts).
Every row is ``id`` and ``hosts``, the mount namespaces of the tasks that handled it.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa
from cluster_job import cluster_session
from pyarrow.fs import FileSelector

from airflow_streambatch.engine.filesystems import resolve

KiB = 1024


def _namespace() -> str:
    return os.readlink("/proc/self/ns/mnt")


def tag(batch: pa.Table) -> pa.Table:
    """First operator (fused with the read): pads each row so blocks are cut often."""
    n = batch.num_rows
    return pa.table({"id": batch["id"], "pad": pa.array([b"x" * 2000] * n), "hosts": pa.array([_namespace()] * n)})


class Slow:
    """Second operator (one task at a time): consumes blocks from both hosts."""

    def __init__(self, sleep_s: float):
        self.sleep_s = sleep_s

    def __call__(self, batch: pa.Table) -> pa.Table:
        time.sleep(self.sleep_s)
        hosts = [f"{h},{_namespace()}" for h in batch["hosts"].to_pylist()]
        return pa.table({"id": batch["id"], "hosts": pa.array(hosts)})


def main() -> None:
    master, source, output, mode = sys.argv[1:5]
    sleep_s = float(sys.argv[5]) if len(sys.argv) > 5 else 0.05
    spark = cluster_session(master, "streambatch-multihost-test")
    import airflow_streambatch.engine as sb

    network = json.loads(os.environ.get("STREAMBATCH_TEST_NETWORK", "{}"))  # ports, TLS: test_multihost.py
    ctx = sb.DataContext(target_max_block_size=64 * KiB, target_min_block_size=16 * KiB, memory_limit=1024 * KiB,
                         progress_interval_s=2, resources={"CPU": 4}, **network)
    fs, root = resolve(source)  # a shared directory, or an object store (s3://)
    files = len(fs.get_file_info(FileSelector(root)))
    ds = (sb.read_parquet(source, override_num_blocks=files).map_batches(tag, batch_format="pyarrow")
          .map_batches(Slow, fn_constructor_args=(sleep_s,), concurrency=1, batch_format="pyarrow"))
    started = time.time()
    summary: dict = {"driver_namespace": _namespace()}
    with ctx.scoped():
        if mode == "write":
            result = ds.write_parquet(output)
            summary["committed"] = sorted(result.committed)
        elif mode == "take_all":
            summary["rows"] = [(r["id"], r["hosts"]) for r in ds.take_all()]
        elif mode == "iter_batches":
            summary["rows"] = [(i, h) for b in ds.iter_batches(batch_size=7, batch_format="pyarrow")
                               for i, h in zip(b["id"].to_pylist(), b["hosts"].to_pylist())]
        elif mode == "pieces":
            one_file = (sb.read_parquet(f"{source.rstrip('/')}/f0.parquet").map_batches(tag, batch_format="pyarrow")
                        .map_batches(Slow, fn_constructor_args=(sleep_s,), concurrency=4, batch_size=10,
                                     batch_format="pyarrow"))
            summary["rows"] = [(r["id"], r["hosts"]) for r in one_file.take_all()]
            summary["model_tasks"] = one_file.last_run_stats.ops[1].tasks_done
            ds = one_file
        elif mode == "materialize":
            kept = ds.materialize()
            first = [(r["id"], r["hosts"]) for r in kept.take_all()]
            second = [(r["id"], r["hosts"]) for r in kept.map_batches(lambda b: b, batch_format="pyarrow").take_all()]
            summary.update(rows=first, rows_again=second, num_blocks=kept.num_blocks())
            del kept
        else:
            raise SystemExit(f"unknown mode {mode}")
    summary["wall_s"] = time.time() - started
    if network:
        from network_probe import probe

        summary["network"] = probe(ctx, spark)
    summary["cross_host_bytes"] = ds.last_run_stats.cross_host_bytes if ds.last_run_stats else None
    print("RESULT " + json.dumps(summary), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
