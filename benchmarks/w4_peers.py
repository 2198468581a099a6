"""W4's other systems: what a user would run instead of the engine (`benchmarks/w4_inference.py`).

The plain-model limit (the model in plain processes, the 1.00x of W4's table), Daft, Spark's
own ways to batch a model (``predict_batch_udf``, ``mapInPandas``) and Ray Data, each as its
user would write it, with the same ``clean``, model, model copies and batch size as ours.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import time
from typing import TYPE_CHECKING

from benchmarks.dag_pipelines import text_pipelines

if TYPE_CHECKING:
    from benchmarks.w4_inference import W4


def embed_in_batches(model, table, batch_size: int):
    """``model`` (a MiniLMEmbedder) over ``table`` ``batch_size`` rows at a time, in order."""
    import pyarrow as pa

    parts = [model(table.slice(i, batch_size)) for i in range(0, table.num_rows, batch_size)]
    return pa.concat_tables(parts) if parts else model(table)


# -- the plain-model limit -------------------------------------------------------------------
def _limit_share(args) -> int:
    """One process's share: load the model, read rows [start, stop), clean, embed, write one file."""
    src, start, stop, out, batch_size = args
    import pyarrow.parquet as pq

    model = text_pipelines.MiniLMEmbedder(device="cpu")  # sets torch to one thread
    table = text_pipelines.clean(pq.read_table(src).slice(start, stop - start))
    pq.write_table(embed_in_batches(model, table, batch_size), os.path.join(out, f"part-{start:08d}.parquet"))
    return table.num_rows


def run_limit(cfg: W4, src: str, out: str, rows: int) -> None:
    os.makedirs(out)
    bounds = [rows * i // cfg.copies for i in range(cfg.copies + 1)]
    shares = [(src, bounds[i], bounds[i + 1], out, cfg.batch_size) for i in range(cfg.copies)]
    with multiprocessing.get_context("spawn").Pool(cfg.copies) as pool:
        pool.map(_limit_share, shares, chunksize=1)


# -- Daft, in a fresh process ------------------------------------------------------------------
def _daft_child(cfg: W4, src: str, out: str, conn) -> None:
    """Import Daft, then time the pipeline alone (as Spark's session start is outside the clock)."""
    import daft
    import pyarrow as pa
    from daft import DataType, col

    @daft.func.batch(return_dtype=DataType.string())
    def clean_text(text):
        """`text_pipelines.clean` on one column: None where clean drops the row (filtered below)."""
        kept = text_pipelines.clean(pa.table({"id": pa.array(range(len(text)), pa.int64()), "text": text.to_arrow()}))
        cleaned = [None] * len(text)
        for i, value in zip(kept.column("id").to_pylist(), kept.column("text").to_pylist()):
            cleaned[i] = value
        return pa.array(cleaned, pa.string())

    @daft.cls(max_concurrency=cfg.copies)
    class Embedder:
        def __init__(self):
            self.model = text_pipelines.MiniLMEmbedder(device="cpu")

        @daft.method.batch(return_dtype=DataType.fixed_size_list(DataType.float32(), text_pipelines.MINILM_DIM),
                           batch_size=cfg.batch_size)
        def __call__(self, text):
            return self.model(pa.table({"text": text.to_arrow()})).column("embedding").combine_chunks()

    start = time.perf_counter()
    df = daft.read_parquet(os.path.join(src, "*.parquet")).with_column("text", clean_text(col("text")))
    df.where(col("text").not_null()).with_column("embedding", Embedder()(col("text"))).write_parquet(out)
    conn.send(time.perf_counter() - start)


def run_daft(cfg: W4, src: str, out: str) -> float:
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_daft_child, args=(cfg, src, out, send))
    child.start()
    wall = receive.recv() if receive.poll(3600) else None
    child.join()
    if child.exitcode != 0 or wall is None:
        raise RuntimeError(f"the Daft process failed (exit code {child.exitcode})")
    return wall


# -- Spark's own ways to batch a model (the caller gives a fresh session) --------------------------
_EMBEDDER = None


def _embedder():
    """One model per Python worker process, as predict_batch_udf's make_predict_fn and pandas UDFs cache it."""
    global _EMBEDDER
    if _EMBEDDER is None:
        _EMBEDDER = text_pipelines.MiniLMEmbedder(device="cpu")
    return _EMBEDDER


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


def run_predict_batch_udf(spark, cfg: W4, src: str, out: str) -> None:
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType

    embed = predict_batch_udf(_make_predict_fn, return_type=ArrayType(FloatType()), batch_size=cfg.batch_size)
    df = spark.read.parquet(src).mapInArrow(_clean_arrow, "id long, text string")
    df.withColumn("embedding", embed("text")).write.parquet(out)


def _embed_pandas(frames, batch_size: int):
    import pyarrow as pa

    for frame in frames:  # Arrow batches of up to 10,000 rows (Spark's default): the model takes batch_size at a time
        table = text_pipelines.clean(pa.Table.from_pandas(frame, preserve_index=False))
        yield embed_in_batches(_embedder(), table, batch_size).to_pandas()


def run_map_in_pandas(spark, cfg: W4, src: str, out: str) -> None:
    embed = functools.partial(_embed_pandas, batch_size=cfg.batch_size)
    spark.read.parquet(src).mapInPandas(embed, "id long, text string, embedding array<float>").write.parquet(out)


# -- Ray Data ----------------------------------------------------------------------------------------
def start_ray(cfg: W4) -> None:
    """A new local Ray, started outside the clock as Spark's session is."""
    import ray

    # one logical CPU more than model copies: with exactly `copies`, the actors take every CPU and
    # Ray Data's read and write tasks wait forever for one (seen: a deadlock at 0 rows)
    ray.init(num_cpus=cfg.copies + 1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"], "HF_HUB_OFFLINE": "1"}})


def run_ray(cfg: W4, src: str, out: str) -> None:
    import ray

    # num_cpus=1 per model copy, as the earlier W4 ran it (not rerun since: Ray was not installed here)
    (ray.data.read_parquet(src).map_batches(text_pipelines.clean, batch_format="pyarrow")
     .map_batches(text_pipelines.MiniLMEmbedder, batch_format="pyarrow", batch_size=cfg.batch_size,
                  concurrency=cfg.copies, num_cpus=1).write_parquet(out))
