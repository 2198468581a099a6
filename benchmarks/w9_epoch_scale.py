"""W9: epoch scale (issue 15, item 3): a flat cost per partition up to tens of thousands of partitions.

Epochs of N one-file partitions (tiny Parquet files, one row each), run two ways over
the same files in the same Spark application:

* **engine alone** (the baseline): ``read_parquet(paths, override_num_blocks=N)
  .write_parquet(out, mode="resume")``, the write `run_epoch` does, with nothing around it;
* **operator path**: what `StreamBatchOperator` does in-process: the manifest read back
  from the sensor's pointer (`manifest_from_xcom`), `run_epoch` with the operator's
  Task State Store callback (`progress_summary`), and the bounded XCom summary.

The overhead per partition is measured two ways. End to end: (operator path - engine
alone) / N, from the fastest of several runs of each, alternating which goes first; on
this shared 2-core machine a run's time varies by a second or more, so at small N this
difference is mostly noise. Directly: the epoch layer's own time within the operator
path's run, i.e. its time outside the engine's write (checks, manifest, snapshots,
summaries: the run's wall time minus the engine's) plus its time in the per-commit
callback (journal line, log line, progress; ``metrics["commit_bookkeeping_s"]``). The
flatness ratio and the 10 ms target use the direct figure. The sensor's side
(`list_inputs`, writing the manifest, the pointer) is timed apart, with the listing as
it was before (one ``get_file_info`` per file) for comparison. XCom bytes per epoch
are what both tasks push (the sensor's pointer, the operator's summary and its two
link values), beside what they pushed before (the whole manifest and the whole record).
Task logging is on (INFO, to a file), as in an Airflow task.

    python -m benchmarks.w9_epoch_scale [--quick] [--out DIR]
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import tempfile
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import (engine_context, markdown_table, parse_args, save, spark_session, subplots, timed,
                               warm_up)

XCOM_TARGET = 64 * 1024
OVERHEAD_TARGET_MS = 10.0
FLATNESS_TARGET = 1.5


@dataclass
class W9:
    sizes: tuple = (200, 2_000, 20_000)
    reps: int = 5  # runs per system at sizes up to 2,000 (the fastest counts); larger sizes run twice
    slots: int = 2


QUICK = W9(sizes=(50, 200), reps=3)


def _identity(ds, epoch):
    return ds


class _Store:
    """A Task State Store: what the operator's callback writes, kept as JSON like Airflow keeps it."""

    def __init__(self):
        self.values: dict[str, str] = {}

    def get(self, key):
        return json.loads(self.values[key]) if key in self.values else None

    def set(self, key, value):
        self.values[key] = json.dumps(value)


def write_files(directory: str, n: int) -> None:
    os.makedirs(directory)
    for i in range(n):
        pq.write_table(pa.table({"id": [i], "text": [f"row {i}"]}), f"{directory}/part-{i:06d}.parquet")


def list_before(path: str) -> int:
    """The listing as `list_inputs` did it before: the files, then one get_file_info per file."""
    from airflow_streambatch.engine.filesystems import resolve
    from airflow_streambatch.engine.plan.datasource import expand_paths

    count = 0
    for file_path, _ in expand_paths(path):
        fs, inner = resolve(file_path)
        count += fs.get_file_info(inner).mtime is not None
    return count


def sensor(in_dir: str, manifest_dir: str, start: str, end: str) -> tuple[dict, float, float, float]:
    """(the XCom pointer, seconds to list and freeze, seconds to list now and as before: fastest of 3)."""
    from airflow_streambatch.epochs import EpochManifest, list_inputs
    from airflow_streambatch.epochs.manifest_store import freeze

    seconds, pointer = timed(lambda: freeze(EpochManifest(start, end, list_inputs(in_dir)),
                                            manifest_dir))
    list_s = min(timed(lambda: list_inputs(in_dir))[0] for _ in range(3))
    before_s = min(timed(lambda: list_before(in_dir))[0] for _ in range(3))
    return pointer, seconds, list_s, before_s


def engine_alone(paths: list[str], out: str) -> float:
    from airflow_streambatch.engine import read_api

    def run():
        result = read_api.read_parquet(paths, override_num_blocks=len(paths)).write_parquet(out, mode="resume")
        assert len(result.files) == len(paths), (len(result.files), len(paths))

    return timed(run)[0]


def operator_path(pointer: dict, out: str) -> tuple[float, dict, dict]:
    """(seconds, the operator's XCom values, facts) for the in-process operator's work around the engine."""
    from airflow_streambatch.epochs import run_epoch
    from airflow_streambatch.epochs.checkpoint import as_uri
    from airflow_streambatch.epochs.manifest_store import manifest_from_xcom
    from airflow_streambatch.epochs.summary import epoch_summary
    from airflow_streambatch.operators.streambatch import STATE_KEY, StreamBatchOperator

    store = _Store()

    def run():
        manifest, uri = manifest_from_xcom(pointer)
        record = run_epoch(manifest, _identity, output_path=out,
                           on_progress=lambda r: store.set(STATE_KEY, StreamBatchOperator.progress_summary(r, uri)))
        store.set(STATE_KEY, StreamBatchOperator.progress_summary(record, uri))
        return record, epoch_summary(record, manifest_uri=uri)

    seconds, (record, summary) = timed(run)
    assert record.status == "succeeded" and summary["committed"] == len(record.partitions), summary
    xcoms = {"return_value": summary, "streambatch_output": as_uri(out), "streambatch_spark_ui": ""}
    before = len(json.dumps(record.epoch)) + len(json.dumps(record.to_dict()))  # whole manifest + whole record
    return seconds, xcoms, {"xcom_before": before, "record_bytes": os.path.getsize(f"{out}/_epoch.json"),
                            "task_state_bytes": len(store.values[STATE_KEY]),
                            "layer_s": seconds - record.metrics["wall_s"] + record.metrics["commit_bookkeeping_s"]}


def measure(cfg: W9, n: int, work: str) -> dict:
    in_dir = f"{work}/in-{n}"
    write_files(in_dir, n)
    start, end = "2026-11-22T09:00:00+00:00", "2026-11-22T10:00:00+00:00"
    pointer, sensor_s, list_s, list_before_s = sensor(in_dir, f"{work}/manifests", start, end)
    paths = [f"{in_dir}/part-{i:06d}.parquet" for i in range(n)]
    reps = cfg.reps if n <= 2_000 else 2
    engine_s, epoch_s, layer_s = [], [], []
    for rep in range(reps):  # alternate, so that neither system always runs on a warmer machine
        for system in ("engine", "operator") if rep % 2 == 0 else ("operator", "engine"):
            engine_context(resources={"CPU": cfg.slots})
            if system == "engine":
                engine_s.append(engine_alone(paths, f"{work}/engine-{n}-{rep}"))
            else:
                seconds, xcoms, facts = operator_path(pointer, f"{work}/epoch-{n}-{rep}")
                epoch_s.append(seconds)
                layer_s.append(facts.pop("layer_s"))
        print(f"  N={n} rep {rep}: engine {engine_s[-1]:.2f} s, operator path {epoch_s[-1]:.2f} s", flush=True)
        shutil.rmtree(f"{work}/engine-{n}-{rep}")
        shutil.rmtree(f"{work}/epoch-{n}-{rep}")
    engine, epoch = min(engine_s), min(epoch_s)
    xcom_bytes = len(json.dumps(pointer)) + sum(len(json.dumps(v)) for v in xcoms.values())
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return {
        "partitions": n, "reps": reps, "engine_s": engine, "operator_s": epoch, "engine_runs_s": engine_s,
        "operator_runs_s": epoch_s, "overhead_ms_per_partition": 1000 * (epoch - engine) / n,
        "engine_ms_per_partition": 1000 * engine / n,
        "layer_ms_per_partition": 1000 * statistics.median(layer_s) / n, "layer_runs_s": layer_s,
        "sensor_ms_per_partition": 1000 * sensor_s / n, "list_ms_per_partition": 1000 * list_s / n,
        "list_before_ms_per_partition": 1000 * list_before_s / n,
        "xcom_bytes": xcom_bytes, "sensor_xcom_bytes": len(json.dumps(pointer)), **facts,
    }


def main() -> None:
    args = parse_args(__doc__)
    cfg = QUICK if args.quick else W9()
    work, logs = tempfile.mkdtemp(prefix="streambatch-w9-"), tempfile.mkdtemp(prefix="streambatch-w9-log-")
    import airflow_streambatch.operators.streambatch  # noqa: F401 - Airflow configures logging on import: first

    logging.basicConfig(filename=os.path.join(logs, "task.log"), level=logging.INFO, force=True,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")  # INFO to a file, as a task logs
    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark_session(cfg.slots)
    warm_up(cfg.slots)
    runs = []
    try:
        for n in cfg.sizes:
            runs.append(measure(cfg, n, work))
            r = runs[-1]
            print(f"N={n}: overhead {r['overhead_ms_per_partition']:.2f} ms/partition, XCom {r['xcom_bytes']} B "
                  f"(before {r['xcom_before']} B)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(logs, ignore_errors=True)
    small, large = runs[0], runs[-1]
    flat = large["layer_ms_per_partition"] / small["layer_ms_per_partition"]
    rows = [[f"{r['partitions']:,}", f"{r['engine_s']:.2f}", f"{r['operator_s']:.2f}",
             f"{r['overhead_ms_per_partition']:.2f}", f"{r['layer_ms_per_partition']:.3f}",
             f"{r['sensor_ms_per_partition']:.3f}",
             f"{r['list_ms_per_partition']:.3f} / {r['list_before_ms_per_partition']:.3f}",
             f"{r['xcom_bytes']:,}", f"{r['xcom_before']:,}", f"{r['record_bytes']:,}"] for r in runs]
    table = (f"W9: epochs of one-file partitions (tiny Parquet files), {cfg.slots} slots; engine alone "
             f"(one block per file through `override_num_blocks`, as the epoch's partitions are) vs the "
             f"operator's path (the fastest of {cfg.reps} runs each up to 2,000 partitions, of 2 above)\n\n"
             + markdown_table(["partitions", "engine alone (s)", "operator path (s)",
                               "end-to-end difference (ms/partition)", "epoch layer's own time (ms/partition)",
                               "sensor list + freeze (ms/partition)",
                               "listing now / before (ms/partition)", "XCom bytes/epoch", "XCom before",
                               "_epoch.json bytes"], rows)
             + f"\n\nThe epoch layer's time per partition at {large['partitions']:,} vs {small['partitions']:,} "
               f"partitions: {flat:.2f}x (target <= {FLATNESS_TARGET}x), {large['layer_ms_per_partition']:.3f} ms "
               f"(target < {OVERHEAD_TARGET_MS:.0f} ms); XCom at "
               f"{large['partitions']:,}: {large['xcom_bytes']:,} B, {large['xcom_before'] / large['xcom_bytes']:.0f}x "
               f"less than before (target < {XCOM_TARGET:,} B).")

    xs = [r["partitions"] for r in runs]
    fig, (left, right) = subplots(2, figsize=(10, 4))
    left.plot(xs, [r["layer_ms_per_partition"] for r in runs], marker="o", label="epoch layer's own time")
    left.plot(xs, [max(r["overhead_ms_per_partition"], 1e-3) for r in runs], marker="^", linestyle="--",
              label="operator path - engine alone (noisy)")
    left.plot(xs, [r["engine_ms_per_partition"] for r in runs], marker="s", label="engine alone")
    left.axhline(OVERHEAD_TARGET_MS, color="grey", linewidth=0.8, linestyle=":", label="10 ms target")
    left.set_ylabel("ms per partition")
    left.set_yscale("log")
    right.plot(xs, [r["xcom_bytes"] for r in runs], marker="o", label="XCom now (pointer + summary)")
    right.plot(xs, [r["xcom_before"] for r in runs], marker="s", label="before (manifest + record)")
    right.axhline(XCOM_TARGET, color="grey", linewidth=0.8, linestyle=":", label="64 KiB target")
    right.set_yscale("log")
    right.set_ylabel("XCom bytes per epoch")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("partitions in the epoch")
        ax.legend()
    fig.suptitle("W9 epoch scale: cost per partition and XCom size")
    save(args.out, "w9_epoch_scale" + ("_quick" if args.quick else ""),
         {"config": asdict(cfg), "runs": runs, "flatness": flat}, table, fig)


if __name__ == "__main__":
    main()
