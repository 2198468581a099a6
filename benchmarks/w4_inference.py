"""W4: real batch inference. Parquet text -> clean (CPU) -> all-MiniLM-L6-v2 embeddings -> parquet.

The same model (the packaged weights of the example DAG, ``dags/text_pipelines.py``),
the same input files, the same cleaning function and the same number of model copies
(one per core, one torch thread each) for every system, in one run:

* ours: the streaming batch engine (clean and embed as separate operators);
* predict-batch-udf: Spark's ``pyspark.ml.functions.predict_batch_udf`` after a
  ``mapInArrow`` clean, the way Spark's docs batch a model;
* map-in-pandas: one ``mapInPandas`` that cleans and embeds with a per-worker model;
* ray-data: Ray Data ``map_batches`` with an actor pool (skipped with a note if
  ``ray[data]`` is not installed: ``pip install 'ray[data]'``).

Reports rows/s and the peak resident memory of every process involved (this driver,
Spark's JVM and Python workers, or Ray's processes), sampled every 100 ms.

    python -m benchmarks.w4_inference [--quick]      # needs the [embed] extra (torch CPU build)
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from benchmarks.common import MiB, PeakMemory, engine_context, markdown_table, parse_args, save, spark_session

_dags = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dags")
sys.path.insert(0, _dags)
os.environ["PYTHONPATH"] = os.pathsep.join([_dags, os.environ.get("PYTHONPATH", "")])
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import text_pipelines  # noqa: E402  (the example DAG's pipeline module, from dags/)


@dataclass
class W4:
    files: int = 8
    rows_per_file: int = 1000
    copies: int = 2  # model copies = cores here
    batch_size: int = 64


QUICK = W4(files=2, rows_per_file=100)


_EMBEDDER = None


def _import_model_libraries(_):
    import sentence_transformers  # noqa: F401
    import torch  # noqa: F401


def _embedder():
    """One model per Python worker process, as predict_batch_udf's make_predict_fn and pandas UDFs cache it."""
    global _EMBEDDER
    if _EMBEDDER is None:
        _EMBEDDER = text_pipelines.MiniLMEmbedder(device="cpu")
    return _EMBEDDER


def run_ours(cfg: W4, src: str, out: str) -> int:
    import airflow_streambatch.engine as sb

    engine_context(resources={"CPU": cfg.copies})
    ds = (sb.read_parquet(src, override_num_blocks=cfg.files).map_batches(text_pipelines.clean, batch_size=1024,
                                                                          batch_format="pyarrow")
          .map_batches(text_pipelines.MiniLMEmbedder, batch_size=cfg.batch_size, num_cpus=1, concurrency=cfg.copies,
                       batch_format="pyarrow"))
    return ds.write_parquet(out).rows


def _clean_arrow(batches):
    import pyarrow as pa

    for batch in batches:
        yield from text_pipelines.clean(pa.Table.from_batches([batch])).to_batches()


def _make_predict_fn():
    model = _embedder().model

    def predict(texts):
        return model.encode(list(texts), batch_size=len(texts), convert_to_numpy=True, normalize_embeddings=True,
                            show_progress_bar=False)

    return predict


def run_predict_batch_udf(spark, cfg: W4, src: str, out: str) -> int:
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    embed = predict_batch_udf(_make_predict_fn, return_type=ArrayType(FloatType()), batch_size=cfg.batch_size)
    df = spark.read.parquet(src).mapInArrow(_clean_arrow, "id long, text string")
    df.withColumn("embedding", embed("text")).write.mode("overwrite").parquet(out)
    return spark.read.parquet(out).count()


def _embed_pandas(frames):
    import pyarrow as pa

    for frame in frames:
        table = _embedder()(text_pipelines.clean(pa.Table.from_pandas(frame, preserve_index=False)))
        yield table.to_pandas()


def run_map_in_pandas(spark, cfg: W4, src: str, out: str) -> int:
    df = spark.read.parquet(src).mapInPandas(_embed_pandas, "id long, text string, embedding array<float>")
    df.write.mode("overwrite").parquet(out)
    return spark.read.parquet(out).count()


def start_ray(cfg: W4) -> bool:
    """Start a local Ray (outside the timed region, as Spark's session is); False if not installed."""
    try:
        import ray
    except ImportError:
        return False
    # one logical CPU more than model copies: with exactly `copies`, the actors take every CPU and
    # Ray Data's read and write tasks wait forever for one (seen: a deadlock at 0 rows)
    ray.init(num_cpus=cfg.copies + 1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"], "HF_HUB_OFFLINE": "1"}})
    return True


def run_ray(cfg: W4, src: str, out: str) -> int:
    import ray

    ds = (ray.data.read_parquet(src).map_batches(text_pipelines.clean, batch_format="pyarrow", batch_size=1024)
          .map_batches(text_pipelines.MiniLMEmbedder, batch_format="pyarrow", batch_size=cfg.batch_size,
                       concurrency=cfg.copies, num_cpus=1))
    ds.write_parquet(out)
    return ray.data.read_parquet(out).count()


def main() -> None:
    from airflow_streambatch.demo import generate

    args = parse_args(__doc__)
    cfg = QUICK if args.quick else W4()
    work = tempfile.mkdtemp(prefix="streambatch-w4-")
    src = generate(work, datetime(2026, 11, 22, 10, tzinfo=timezone.utc), cfg.files, cfg.rows_per_file)
    total = cfg.files * cfg.rows_per_file
    spark = spark_session(cfg.copies)
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(max(1, os.path.getsize(glob.glob(f"{src}/*")[0]))))
    systems = [
        ("ours", lambda out: run_ours(cfg, src, out)),
        ("predict-batch-udf", lambda out: run_predict_batch_udf(spark, cfg, src, out)),
        ("map-in-pandas", lambda out: run_map_in_pandas(spark, cfg, src, out)),
        ("ray-data", lambda out: run_ray(cfg, src, out)),
    ]
    # start Spark's Python workers and import torch in them once; each system then loads its own models
    spark.sparkContext.parallelize(range(cfg.copies), cfg.copies).foreach(_import_model_libraries)
    results = {}
    for name, fn in systems:
        if name == "ray-data" and not start_ray(cfg):
            print(f"{name}: skipped (ray[data] is not installed: pip install 'ray[data]')")
            results[name] = None
            continue
        out = os.path.join(work, f"out-{name}")
        with PeakMemory() as rss:
            start = time.perf_counter()
            rows = fn(out)
            wall = time.perf_counter() - start
        assert rows == total, f"{name} wrote {rows} rows, expected {total}"
        results[name] = {"time_s": wall, "rows_per_s": total / wall, "peak_rss_mib": rss.peak / MiB,
                         "peak_processes": rss.peak_processes}
        print(f"{name}: {total / wall:.1f} rows/s, peak RSS {rss.peak / MiB:.0f} MiB in up to "
              f"{rss.peak_processes} processes", flush=True)
    if results.get("ray-data"):
        import ray

        ray.shutdown()
    shutil.rmtree(work, ignore_errors=True)

    base = results["predict-batch-udf"]["rows_per_s"]
    rows = [[name, "skipped (ray[data] not installed)", "", "", "", ""] if r is None else
            [name, f"{r['rows_per_s']:.1f}", f"{r['rows_per_s'] / base:.2f}x", f"{r['time_s']:.1f}",
             f"{r['peak_rss_mib']:.0f}", str(r["peak_processes"])] for name, r in results.items()]
    table = (f"W4: {total} sentences, all-MiniLM-L6-v2 on CPU, {cfg.copies} model copies x 1 thread\n\n"
             + markdown_table(["system", "rows/s", "vs predict_batch_udf", "time s", "peak RSS MiB (all processes)",
                               "processes"], rows))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = {k: v for k, v in results.items() if v}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.bar(list(measured), [v["rows_per_s"] for v in measured.values()], color="#4c72b0")
    ax1.set_ylabel("rows/s")
    ax2.bar(list(measured), [v["peak_rss_mib"] for v in measured.values()], color="#dd8452")
    ax2.set_ylabel("peak RSS, MiB")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=20)
    fig.suptitle(f"W4: batch embedding of {total} sentences")
    save(args.out, "w4_inference" + ("_quick" if args.quick else ""), {"config": asdict(cfg), "results": results},
         table, fig)


if __name__ == "__main__":
    main()
