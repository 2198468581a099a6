"""W4: real batch inference. Parquet text -> clean (CPU) -> all-MiniLM-L6-v2 embeddings -> parquet.

Every system gets the same input files, the same ``clean`` function, the same model
(the packaged weights of the example DAG, ``dags/text_pipelines.py``), the same number
of model copies (one per core, one torch thread each) and encodes 64 rows at a time,
in input order. Each runs as its user would write it, with that system's defaults:

* plain-model limit: the model called directly, one plain Python process per copy
  (``multiprocessing`` spawn), each taking an even share of the rows: what the
  model costs on this machine with nothing around it, the 1.00x of the table;
* ours: ``read_parquet -> map_batches(clean) -> map_batches(MiniLMEmbedder,
  concurrency=copies) -> write_parquet`` on a default ``DataContext`` (no block
  counts, resources or batch sizes beyond the model's 64);
* daft: Daft's native runner, the model in a ``@daft.cls(max_concurrency=copies)``
  class (skipped with a note if ``daft`` is not installed);
* predict-batch-udf: Spark's ``pyspark.ml.functions.predict_batch_udf`` after a
  ``mapInArrow`` clean, the way Spark's docs batch a model;
* map-in-pandas: one ``mapInPandas`` that cleans and embeds with a per-worker model;
* ours-connect: ours, unchanged, as the client of a Spark Connect server process
  (``local[copies]``, started outside the clock; its Python workers started too);
* ray-data: Ray Data ``map_batches`` with an actor pool (skipped with a note if
  ``ray[data]`` is not installed).

Two text sets of real English (`benchmarks/sentences.py`): short sentences and long
paragraphs from the standard library's docstrings, so batches vary in length as
real text does.

What the timed region holds, for fairness: a user waits for the model to load, so
every system loads its models inside it (fresh processes: the limit's and Daft's
processes are new, Spark gets a new session whose Python workers have not imported
torch, Ray a new ``ray.init``). Starting the Spark session (and its Python workers)
or Ray stays outside, as a long-lived application pays it once; Daft is timed from
after ``import daft`` in a fresh process. Spark sessions use Spark's defaults
(``local[copies]``, 1 GiB driver memory) plus the engine's ``SPARK_DEFAULTS``.

Memory: the peak summed RSS of this process and every descendant (Spark's JVM and
Python workers, the limit's and Daft's processes, Ray's), sampled every 100 ms; for
ours plus the engine's peak of buffered blocks, which live in tmpfs where no RSS
shows them. Systems without a JVM (the limit, Daft, Ray) run before the first Spark
session starts, so their figures hold no JVM; every figure holds this process.
Output is checked after the clock stops: one row per input id, with a 384-float
embedding.

The other systems are in `benchmarks/w4_peers.py`.

    python -m benchmarks.w4_inference [--quick]      # needs the [embed] extra (torch CPU build)
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass

from benchmarks.common import (
    MiB,
    PeakMemory,
    check,
    connect_session,
    markdown_table,
    parse_args,
    save,
    spark_session,
    subplots,
)
from benchmarks.dag_pipelines import text_pipelines
from benchmarks.sentences import write_text_set
from benchmarks.w4_peers import run_daft, run_limit, run_map_in_pandas, run_predict_batch_udf, run_ray, start_ray


@dataclass
class W4:
    files: int = 8
    short_rows: int | None = None  # None: the whole set
    long_rows: int | None = None
    copies: int = 2  # model copies = cores here
    batch_size: int = 64
    skip: tuple[tuple[str, str], ...] = ()  # (text set, system) pairs left out of this size


# CI's smoke run: every system on a few short sentences, the Spark baselines not on the long set
QUICK = W4(files=2, short_rows=200, long_rows=64, skip=(("long", "predict-batch-udf"), ("long", "map-in-pandas"),
                                                         ("long", "ours-connect")))
SETS = ("short", "long")
LIMIT = "plain-model limit"
SPARK = ("ours", "ours-connect", "predict-batch-udf", "map-in-pandas")
SYSTEMS = (LIMIT, "daft", *SPARK, "ray-data")
RUN_ORDER = (LIMIT, "daft", "ray-data", *SPARK)  # without a JVM first, so that their memory holds none
_MISSING = {"daft": "daft is not installed: pip install daft", "ray-data": "ray[data] is not installed"}


# -- ours and the Spark baselines (a fresh session each) --------------------------------------------
def fresh_spark(cfg: W4, sql: bool, connect: bool = False):
    """A new local session whose Python workers are started but have imported no model library.

    Spark starts one Python worker daemon for RDD jobs (the engine's) and another for SQL's
    Arrow UDFs (``mapInPandas``, ``predict_batch_udf``): a job of the kind the system runs
    starts its daemon and workers outside the clock (seen: 12 s for the first ``mapInPandas``
    on a busy machine), and only that kind, so no idle workers of the other count in memory."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()  # its Python workers exit with it, and their imports and models with them
    if connect:  # a new server: its Python workers have not imported torch either
        spark = _CONNECT.enter_context(connect_session(cfg.copies, driver_memory="1g"))
        spark.range(0, cfg.copies, 1, cfg.copies).mapInArrow(_same, "id long").collect()
        return spark
    spark = spark_session(cfg.copies, driver_memory="1g")  # Spark's default driver memory
    if sql:
        spark.range(cfg.copies, numPartitions=cfg.copies).mapInArrow(_same, "id long").collect()
    else:
        spark.sparkContext.parallelize(range(cfg.copies), cfg.copies).foreach(_nothing)
    return spark


_CONNECT = contextlib.ExitStack()


def _nothing(_) -> None:
    pass


def _same(batches):
    yield from batches


def run_ours(cfg: W4, src: str, out: str):
    """The engine as a user runs it: a default DataContext, the pipeline of the example DAG. Returns the dataset."""
    import airflow_streambatch.engine as sb

    with sb.DataContext().scoped():
        ds = (sb.read_parquet(src).map_batches(text_pipelines.clean, batch_format="pyarrow")
              .map_batches(text_pipelines.MiniLMEmbedder, batch_size=cfg.batch_size, concurrency=cfg.copies,
                           batch_format="pyarrow"))
        ds.write_parquet(out)
    return ds


# -- one measurement ----------------------------------------------------------------------------------
def check_output(out: str, ids: int) -> None:
    """Every input id exactly once, each with a 384-float embedding (files named ``_*``/``.*`` are not data)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = pq.read_table(out, columns=["id", "embedding"])
    unique = len(pc.unique(table.column("id")))
    check(table.num_rows == ids and unique == ids, f"{out}: {table.num_rows} rows, {unique} ids, expected {ids}")
    lengths = pc.list_value_length(table.column("embedding"))
    check(pc.min(lengths).as_py() == pc.max(lengths).as_py() == text_pipelines.MINILM_DIM,
          f"{out}: embeddings of {pc.min(lengths)}-{pc.max(lengths)} floats, expected {text_pipelines.MINILM_DIM}")


def measure(name: str, cfg: W4, src: str, out: str, rows: int) -> dict:
    spark = fresh_spark(cfg, sql=name != "ours", connect=name == "ours-connect") if name in SPARK else None
    if name == "ray-data":
        start_ray(cfg)
    extra: dict = {}
    with PeakMemory() as rss:
        start = time.perf_counter()
        own_clock = None  # Daft times itself, in its process, from after its import
        if name == LIMIT:
            run_limit(cfg, src, out, rows)
        elif name == "daft":
            own_clock = run_daft(cfg, src, out)
        elif name in ("ours", "ours-connect"):
            stats = run_ours(cfg, src, out).last_run_stats
            extra = {"blocks_peak_mib": stats.peak_memory_bytes / MiB, "spark_jobs": len(stats.launch_log),
                     "stats": stats.summary()}
        elif name == "predict-batch-udf":
            run_predict_batch_udf(spark, cfg, src, out)
        elif name == "map-in-pandas":
            run_map_in_pandas(spark, cfg, src, out)
        else:
            run_ray(cfg, src, out)
        wall = own_clock or time.perf_counter() - start
    if name == "ray-data":
        import ray

        ray.shutdown()
    _CONNECT.close()  # the Connect server of ours-connect, if it ran
    check_output(out, rows)
    peak = rss.peak / MiB + extra.get("blocks_peak_mib", 0)
    print(f"{name}: {wall:.1f} s, {rows / wall:.1f} rows/s, peak {peak:.0f} MiB in up to {rss.peak_processes} "
          f"processes", flush=True)
    if "stats" in extra:
        print(extra["stats"], flush=True)
    return {"time_s": wall, "rows_per_s": rows / wall, "peak_rss_mib": peak, "peak_processes": rss.peak_processes,
            **extra}


def _why_not(kind: str, name: str, cfg: W4) -> str | None:
    if (kind, name) in cfg.skip:
        return "skipped in --quick (a smoke run: Spark's baselines run on the short set)"
    module = {"daft": "daft", "ray-data": "ray"}.get(name)
    if module and importlib.util.find_spec(module) is None:
        return f"skipped ({_MISSING[name]})"
    return None


# -- report -------------------------------------------------------------------------------------------
def report(cfg: W4, sizes: dict, results: dict) -> tuple[str, object]:
    rows = []
    for kind in SETS:
        limit, ours = results[kind][LIMIT]["time_s"], results[kind]["ours"]["time_s"]
        for name in SYSTEMS:
            r = results[kind][name]
            if isinstance(r, str):
                rows.append([kind, name, r, "", "", "", "", ""])
                continue
            rows.append([kind, name, f"{r['time_s']:.1f}", f"{r['rows_per_s']:.1f}", f"{r['time_s'] / limit:.2f}x",
                         f"{r['time_s'] / ours:.2f}x", f"{r['peak_rss_mib']:.0f}", str(r["peak_processes"])])
    described = ", ".join(f"{sizes[k]} {'sentences' if k == 'short' else 'paragraphs'} ({k})" for k in SETS)
    table = (f"W4: {described} in {cfg.files} files each, all-MiniLM-L6-v2 on CPU, {cfg.copies} model copies "
             f"x 1 thread, batches of {cfg.batch_size}\n\n"
             + markdown_table(["text set", "system", "wall s", "rows/s", "time / limit", "time / ours",
                               "peak RSS MiB (all processes)", "processes"], rows))
    shown = [n for n in SYSTEMS if any(not isinstance(results[k][n], str) for k in SETS)]
    fig, ax = subplots(1, (10, 4))
    width = 0.8 / len(shown)
    for i, name in enumerate(shown):
        measured = [(j, results[kind][name]["time_s"] / results[kind][LIMIT]["time_s"]) for j, kind in enumerate(SETS)
                    if not isinstance(results[kind][name], str)]
        bars = ax.bar([j + (i - (len(shown) - 1) / 2) * width for j, _ in measured], [r for _, r in measured], width,
                      color=f"C{i}", label=name)
        ax.bar_label(bars, [f"{r:.2f}" for _, r in measured], fontsize=7)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(SETS)), [f"{k}: {sizes[k]} rows" for k in SETS])
    ax.set_ylabel("wall time / plain-model limit")
    ax.legend(fontsize=8, ncol=len(shown), loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.suptitle("W4: batch embedding, time against the plain-model limit (lower is better)")
    return table, fig


def main() -> None:
    args = parse_args(__doc__)
    cfg = QUICK if args.quick else W4()
    work = tempfile.mkdtemp(prefix="streambatch-w4-")
    srcs = {kind: os.path.join(work, kind) for kind in SETS}
    sizes = {kind: write_text_set(kind, srcs[kind], cfg.files, cfg.short_rows if kind == "short" else cfg.long_rows)
             for kind in SETS}
    results: dict = {kind: {} for kind in SETS}
    for name in RUN_ORDER:
        for kind in SETS:
            why = _why_not(kind, name, cfg)
            if why:
                results[kind][name] = why
                print(f"{kind} {name}: {why}", flush=True)
                continue
            print(f"== {kind} ({sizes[kind]} rows): {name}", flush=True)
            results[kind][name] = measure(name, cfg, srcs[kind], os.path.join(work, f"out-{kind}-{name}"), sizes[kind])
    shutil.rmtree(work, ignore_errors=True)
    table, fig = report(cfg, sizes, results)
    save(args.out, "w4_inference" + ("_quick" if args.quick else ""),
         {"config": asdict(cfg), "rows": sizes, "results": results}, table, fig)


if __name__ == "__main__":
    main()
