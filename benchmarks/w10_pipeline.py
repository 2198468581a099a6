"""W10, the pipeline: W4's pipeline writing to a local directory, to S3 as Parquet, and to Delta and
Iceberg tables on S3: the time of each against local.

The pipeline of W4 (`benchmarks/w4_inference.py`) and of the example DAG (``dags/text_pipelines.py``):
Parquet text files (``airflow_streambatch.demo.generate``, in a local directory) ->
``text_pipelines.clean`` -> an embedding, written to one of four targets:

* **local**: ``write_parquet`` to a local temporary directory (a commit is a rename);
* **S3 Parquet**: ``write_parquet`` to ``s3://`` (a commit is a conditional create of the
  record, a server-side copy and a delete per file: `engine/output/protocols.py`);
* **Delta on S3**: ``write_delta``, batches of partitions per Delta transaction, each
  partition with its application-transaction marker (delta-rs);
* **Iceberg on S3**: ``write_iceberg`` into a table of a SQL catalog on SQLite (a local file)
  whose warehouse is on S3, batches of partitions per snapshot (pyiceberg).

The embedding is ``text_pipelines.hashing_embed`` (feature hashing of the words, no model),
not W4's all-MiniLM-L6-v2: on this machine's 2 cores the model would take minutes per run and
drown what this benchmark compares, the write. Engine defaults throughout (no
``override_num_blocks``: the read picks the partitions). The S3 server is moto's, started by
the benchmark on 127.0.0.1 (`benchmarks/moto_s3.py`). Each run writes to a fresh place (on
S3 a fresh bucket; for Iceberg a fresh catalog and table, created untimed), the targets
take turns in a rotating order, and the fastest of ``reps`` runs per target counts. Every
run is read back by the target's own reader (pyarrow over the directory with ``_``-prefixed
paths skipped, a deltalake scan, a pyiceberg scan): every input id once, with its embedding.
One more, untimed, run per S3 target counts its requests with moto's request recorder, and
the table's commits (Delta versions, Iceberg snapshots) are counted from its history.

    python -m benchmarks.w10_pipeline [--quick] [--out DIR]
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from airflow_streambatch.engine.filesystems import resolve

from benchmarks.common import (check, engine_context, markdown_table, parse_args, save, spark_session, subplots,
                               timed, warm_up)
from benchmarks.dag_pipelines import text_pipelines
from benchmarks.moto_s3 import METHODS, MotoServer, method_of, plot_requests_per_partition


TARGETS = ("local", "s3", "delta", "iceberg")
LABELS = {"local": "local, Parquet directory", "s3": "S3, Parquet directory", "delta": "S3, Delta table",
          "iceberg": "S3, Iceberg table"}
SCHEMA = pa.schema([("id", pa.int64()), ("text", pa.string()),
                    ("embedding", pa.list_(pa.float32(), text_pipelines.HASHING_DIM))])


@dataclass
class W10Pipeline:
    files: int = 32
    rows_per_file: int = 8_000
    reps: int = 3  # timed runs per target; the fastest counts
    slots: int = 2


QUICK = W10Pipeline(files=4, rows_per_file=250, reps=1)


def pipeline(src: str):
    import airflow_streambatch.engine as sb

    return (sb.read_parquet(src).map_batches(text_pipelines.clean, batch_size=1024, batch_format="pyarrow")
            .map_batches(text_pipelines.hashing_embed, batch_format="pyarrow"))


# -- the targets: each opened fresh (untimed), written (timed), read back and counted ----------
class Target:
    """One fresh place of ``kind`` to write to: ``write(ds)``, then ``ids()`` (every id its reader
    sees, with a check of the embeddings) and ``table_commits()`` (None for a directory)."""

    def __init__(self, kind: str, tag: str, server: MotoServer, work: str):
        self.kind = kind
        if kind == "local":
            self.uri = f"{work}/{tag}"
        elif kind in ("s3", "delta"):
            self.uri = f"{server.bucket(tag)}/out"
        else:  # a catalog of its own (SQLite, local) with its warehouse on S3, and the table, as Ray Data requires
            from pyiceberg.catalog import load_catalog

            self.catalog = {"name": "w10", "type": "sql", "uri": f"sqlite:///{work}/{tag}.db",
                            "warehouse": f"{server.bucket(tag)}/warehouse", "s3.region": os.environ["AWS_REGION"]}
            kwargs = {k: v for k, v in self.catalog.items() if k != "name"}
            catalog = load_catalog("w10", **kwargs, **{"s3.endpoint": server.endpoint})
            catalog.create_namespace("bench")
            self.uri = catalog.create_table("bench.scores", schema=SCHEMA).location()

    def write(self, ds):
        if self.kind in ("local", "s3"):
            return ds.write_parquet(self.uri)
        if self.kind == "delta":
            return ds.write_delta(self.uri)
        return ds.write_iceberg("bench.scores", catalog_kwargs=self.catalog)

    def _table(self) -> pa.Table:
        if self.kind in ("local", "s3"):
            fs, root = resolve(self.uri)
            return pads.dataset(root, filesystem=fs, format="parquet", ignore_prefixes=["_", "."]).to_table()
        if self.kind == "delta":
            return self._delta().to_pyarrow_table()
        return self._iceberg().scan().to_arrow()

    def _delta(self):
        from deltalake import DeltaTable

        from airflow_streambatch.engine.output.delta import default_storage_options

        return DeltaTable(self.uri, storage_options=default_storage_options(self.uri))

    def _iceberg(self):
        from airflow_streambatch.engine.output.iceberg import IcebergFormat

        return IcebergFormat("bench.scores", self.catalog).catalog.load_table("bench.scores")

    def ids(self) -> list[int]:
        table = self._table()
        lengths = pc.list_value_length(table["embedding"])
        check(table.num_rows == 0 or pc.min(lengths).as_py() == pc.max(lengths).as_py() == text_pipelines.HASHING_DIM,
              f"{self.uri}: embeddings are not all {text_pipelines.HASHING_DIM} long")
        return sorted(table["id"].to_pylist())

    def table_commits(self) -> int | None:
        """Commits to the table: Delta versions (the first creates the table with its files), Iceberg snapshots."""
        if self.kind == "delta":
            return len(self._delta().history())
        if self.kind == "iceberg":
            return len(self._iceberg().snapshots())
        return None


def run(cfg: W10Pipeline, src: str, expected: list[int], target: Target, server: MotoServer | None = None) -> dict:
    """One timed write, checked and read back; with ``server``, its requests recorded (the write's alone)."""
    engine_context()  # defaults: the slots are the local session's cores

    def write():
        return timed(lambda: target.write(pipeline(src)))

    figures = {}
    if server is None:
        seconds, result = write()
    else:
        (seconds, result), recorded, logged = server.record(write)
        check(Counter(e["method"] for e in recorded) == Counter(m for m, _, _ in logged),
              f"{target.uri}: the recorder saw {len(recorded)} requests, the access log {len(logged)}")
        methods = Counter(method_of(e) for e in recorded)
        figures = {"requests": len(recorded), "by_method": {m: methods.get(m, 0) for m in METHODS}}
    check(not result.failed, f"{target.uri}: {len(result.failed)} partition(s) failed: {result.failed[:3]}")
    check(result.rows == len(expected), f"{target.uri}: {result.rows} rows committed, expected {len(expected)}")
    check(target.ids() == expected, f"{target.uri}: the reader does not see every input id once")
    commits = target.table_commits()
    partitions = len(result.committed)
    return {"s": seconds, "partitions": partitions, "commits": partitions if commits is None else commits,
            "files": len(result.files), **figures}


def main() -> None:
    from airflow_streambatch.demo import generate

    args = parse_args(__doc__)
    cfg = QUICK if args.quick else W10Pipeline()
    work = tempfile.mkdtemp(prefix="streambatch-w10p-")
    server = MotoServer(work)  # first: sets the AWS variables Spark's workers inherit
    hour = datetime(2026, 11, 22, 10, tzinfo=timezone.utc)
    try:
        src = generate(f"{work}/src", hour, cfg.files, cfg.rows_per_file)
        small = generate(f"{work}/warm", hour, 2, 50)
        expected = sorted(pads.dataset(src, format="parquet", ignore_prefixes=["_", "."]).to_table()["id"].to_pylist())
        warm = sorted(pads.dataset(small, format="parquet", ignore_prefixes=["_", "."]).to_table()["id"].to_pylist())
        spark_session(cfg.slots)
        warm_up(cfg.slots)
        for kind in TARGETS:  # each worker's first S3 client, delta-rs and pyiceberg imported: untimed
            run(cfg, small, warm, Target(kind, f"w10p-warm-{kind}", server, work))
        runs: dict[str, list[dict]] = {kind: [] for kind in TARGETS}
        for rep in range(cfg.reps):
            for kind in TARGETS[rep % len(TARGETS):] + TARGETS[:rep % len(TARGETS)]:  # rotate who goes first
                runs[kind].append(run(cfg, src, expected, Target(kind, f"w10p-{kind}-r{rep}", server, work)))
            print(f"  rep {rep}: " + ", ".join(f"{k} {runs[k][-1]['s']:.2f} s" for k in TARGETS), flush=True)
        requests = {kind: run(cfg, src, expected, Target(kind, f"w10p-{kind}-recorded", server, work), server)
                    for kind in TARGETS[1:]}
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(args, cfg, runs, requests, len(expected))


def report(args, cfg: W10Pipeline, runs: dict[str, list[dict]], requests: dict[str, dict], rows: int) -> None:
    best = {kind: min(values, key=lambda r: r["s"]) for kind, values in runs.items()}
    local = best["local"]["s"]
    table_rows = []
    for kind in TARGETS:
        b, req = best[kind], requests.get(kind)
        row = [LABELS[kind], f"{b['s']:.2f}", f"{b['s'] / local:.2f}x", b["partitions"], b["files"], b["commits"]]
        if req is None:  # local: no requests
            table_rows.append([*row, "", ""])
        else:
            table_rows.append([*row, f"{req['requests'] / req['partitions']:.1f}",
                               " / ".join(f"{req['by_method'][m] / req['partitions']:.1f}" for m in METHODS)])
    table = (f"W10, the W4 pipeline to four targets: {rows:,} texts ({cfg.files} Parquet files) -> "
             f"`text_pipelines.clean` -> `text_pipelines.hashing_embed` (feature hashing, no model: W4's "
             f"MiniLM is not run here) -> the target; engine defaults, {cfg.slots} slots, S3 is moto's server on "
             f"127.0.0.1; " + ("one run each" if cfg.reps == 1 else f"the fastest of {cfg.reps} runs each")
             + "; requests from one more, recorded, write per S3 target\n\n"
             + markdown_table(["target", "write (s)", "vs local", "partitions", "files", "commits",
                               "S3 requests/partition", "PUT / COPY / POST / GET / HEAD / DELETE per partition"],
                              table_rows)
             + "\n\nCommits: one per partition for a directory (a rename locally; a conditional create of its "
               "record on S3); for a table, its transactions (Delta versions, the first creating the "
               "table; Iceberg snapshots), each committing a batch of partitions with their markers.")
    fig, (left, right) = subplots(2, figsize=(11, 4))
    labels = [LABELS[kind].replace(", ", "\n").replace(" directory", "").replace(" table", "") for kind in TARGETS]
    left.bar(labels, [best[kind]["s"] for kind in TARGETS], color=["C0", "C3", "C2", "C1"])
    left.set_ylabel("write time, s (fastest run)")
    plot_requests_per_partition(right, labels[1:], [requests[kind] for kind in TARGETS[1:]])
    fig.suptitle("W10: the W4 pipeline (hashing embedding) writing locally and to S3 as Parquet, Delta, Iceberg")
    save(args.out, "w10_pipeline" + ("_quick" if args.quick else ""),
         {"config": asdict(cfg), "rows": rows, "runs": runs, "best": best, "requests": requests}, table, fig)


if __name__ == "__main__":
    main()
