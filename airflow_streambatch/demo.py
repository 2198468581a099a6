"""The example DAGs end to end on the embedded default: local Spark, SQLite, local files.

    python -m airflow_streambatch.demo generate --hour 2026-11-22T10   # one epoch of input text
    python -m airflow_streambatch.demo run                             # generate, run the DAG, check

``run`` generates the last full hour's input under ``--root``, runs the example DAG
for that hour with ``airflow dags test`` in an Airflow home of its own, prints the
progress lines of the run, then checks the epoch's output (one embedding per input
row, the model's dimension, no duplicates) and prints a summary. The input is
synthetic product-review text, seeded by the hour, so a rerun sees the same data.

``--root`` is a local directory or an object-store URI such as ``s3://bucket/demo``
(docker-compose.yaml's store), reached through ``pyarrow.fs`` with the environment's
endpoint and credentials (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...); ``generate``
creates a missing S3 bucket.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

DIMS = {"embed_text_hourly": 384, "embed_text_light": 64, "embed_text_taskflow": 64}
_SUBJECTS = ["The battery", "This blender", "The delivery", "Customer support", "The screen", "The manual",
             "The zipper", "This jacket", "The app", "The warranty", "The price", "The sound"]
_VERDICTS = ["works better than I hoped", "stopped working after a week", "is fine for the money",
             "arrived late and scratched", "exceeded every expectation", "is confusing at first",
             "feels cheap but does the job", "is the best I have owned", "needs a firmware update"]
_DETAILS = ["I would buy it again.", "Returned it.", "Five stars from me.", "Not worth the hype.",
            "My kids love it.", "Setup took ten minutes.", "Support answered within a day.", ""]
_PROGRESS = re.compile(r"Epoch |committed partition|input partition failed|rows/s|Marking task|Task failed")
_LOG_LINE = re.compile(r"^\S+ \[(\w+)\s*\] (.*?)(?: \[[\w.]+\])?(?: loc=\S+)?(?: \S+=.*)?$")


def _is_uri(root: str) -> bool:
    return "://" in root


def _hour_path(root: str, kind: str, hour: datetime) -> str:
    """``<root>/<kind>/<YYYY-MM-DD>/<HH>``: the layout dags/text_embedding.py reads (in) and writes (embeddings)."""
    parts = (kind, hour.strftime("%Y-%m-%d"), hour.strftime("%H"))
    return "/".join((root.rstrip("/"), *parts)) if _is_uri(root) else os.path.join(root, *parts)


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem of a local path or a URI (``s3://bucket/key``, ``gs://``...) and the path in it."""
    return pafs.FileSystem.from_uri(path) if _is_uri(path) else (pafs.LocalFileSystem(), path)


def _create_bucket(root: str) -> None:
    """An ``s3://`` root's bucket, created when missing (the compose stack's store starts empty)."""
    if not root.startswith("s3://"):
        return
    bucket = root[len("s3://"):].split("/", 1)[0]
    fs, _ = pafs.FileSystem.from_uri(f"s3://{bucket}?allow_bucket_creation=true")
    if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
        fs.create_dir(bucket)


def generate(root: str, hour: datetime, files: int = 4, rows: int = 250) -> str:
    """Write ``files`` parquet files of ``rows`` reviews each for ``hour``, then the ``_SUCCESS`` marker.

    An hour whose marker exists is left as it is: its epoch may be frozen and committed, and
    rewriting its files (even with the same rows) is an input change the next run refuses."""
    _create_bucket(root)
    directory = _hour_path(root, "in", hour)
    fs, path = _filesystem(directory)
    if fs.get_file_info(f"{path}/_SUCCESS").type == pafs.FileType.File:
        return directory
    fs.create_dir(path, recursive=True)
    rng = random.Random(hour.strftime("%Y%m%d%H"))
    base = int(hour.timestamp() // 3600) * 1_000_000
    for f in range(files):
        ids = [base + f * rows + i for i in range(rows)]
        texts = [f"{rng.choice(_SUBJECTS)} {rng.choice(_VERDICTS)}. {rng.choice(_DETAILS)}".strip() for _ in ids]
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "text": texts}),
                       f"{path}/part-{f:03d}.parquet", filesystem=fs)
    with fs.open_output_stream(f"{path}/_SUCCESS"):  # written last: the sensor's frontier marker
        pass
    return directory


def _committed_files(fs: pafs.FileSystem, path: str) -> list[str]:
    """``<path>/p*/*.parquet``: the committed partitions' files (staging and records are ``_``-prefixed)."""
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    files = []
    for info in infos:
        rel = info.path[len(path.rstrip("/")) + 1:].split("/")
        if (info.type == pafs.FileType.File and len(rel) == 2 and rel[0].startswith("p")
                and rel[1].endswith(".parquet") and not rel[1].startswith((".", "_"))):
            files.append(info.path)
    return sorted(files)


def check_output(root: str, hour: datetime, dim: int) -> dict:
    """The epoch's committed output against its input: one embedding per row, ``dim`` floats, no duplicates."""
    in_fs, in_path = _filesystem(_hour_path(root, "in", hour))
    inputs = pq.read_table(in_path, columns=["id"], filesystem=in_fs)
    out_dir = _hour_path(root, "embeddings", hour)
    fs, out_path = _filesystem(out_dir)
    files = _committed_files(fs, out_path)
    if not files:
        raise SystemExit(f"no committed output under {out_dir}")
    out = pa.concat_tables([pq.read_table(f, filesystem=fs) for f in files])
    ids = out.column("id").to_pylist()
    problems = []
    if sorted(ids) != sorted(inputs.column("id").to_pylist()):
        problems.append(f"{len(ids)} output rows for {inputs.num_rows} input rows")
    if len(set(ids)) != len(ids):
        problems.append(f"{len(ids) - len(set(ids))} duplicate ids")
    width = out.schema.field("embedding").type.list_size
    if width != dim:
        problems.append(f"embeddings have {width} dimensions, expected {dim}")
    if problems:
        raise SystemExit("output check failed: " + "; ".join(problems))
    return {"rows": out.num_rows, "dimension": width, "files": len(files), "output": out_dir}


def _dags_folder() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(here, "dags")


def run(dag_id: str, root: str, hour: datetime, airflow_home: str, dags_folder: str, files: int = 4,
        rows: int = 250) -> dict:
    """Generate ``hour``, run ``dag_id`` for it with ``airflow dags test``, check and return the summary."""
    directory = generate(root, hour, files, rows)
    print(f"input: {directory} ({files} files)", flush=True)
    os.makedirs(airflow_home, exist_ok=True)
    env = dict(os.environ, AIRFLOW_HOME=airflow_home, AIRFLOW__CORE__DAGS_FOLDER=dags_folder,
               AIRFLOW__CORE__LOAD_EXAMPLES="False", STREAMBATCH_DEMO_ROOT=root)
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, stdout=subprocess.DEVNULL)
    started = time.monotonic()
    log_path = os.path.join(airflow_home, f"{dag_id}-{hour:%Y%m%dT%H}.log")
    run_at = (hour + timedelta(hours=1)).isoformat()  # the example DAG's run at hour+1h covers `hour`
    with open(log_path, "w") as log, subprocess.Popen(
            [airflow, "dags", "test", dag_id, run_at], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            log.write(line)
            if _PROGRESS.search(line):
                match = _LOG_LINE.match(line.rstrip())
                print("  " + (match.group(2) if match else line.rstrip()), flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"airflow dags test {dag_id} exited with {proc.returncode}; full log: {log_path}")
    summary = check_output(root, hour, DIMS[dag_id])
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["log"] = log_path
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_streambatch.demo", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["generate", "run"])
    parser.add_argument("--root", default=os.environ.get("STREAMBATCH_DEMO_ROOT",
                                                         os.path.expanduser("~/streambatch-demo")))
    parser.add_argument("--hour", help="epoch start, e.g. 2026-11-22T10 (UTC); default: the last full hour")
    parser.add_argument("--dag", default="embed_text_hourly", choices=sorted(DIMS))
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rows", type=int, default=250)
    parser.add_argument("--airflow-home", help="default: <root>/airflow, or ~/streambatch-demo/airflow for a URI root")
    parser.add_argument("--dags-folder", default=_dags_folder())
    args = parser.parse_args(argv)
    if args.hour:
        hour = datetime.fromisoformat(args.hour).replace(minute=0, second=0, microsecond=0, tzinfo=timezone.utc)
    else:
        hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    root = args.root if _is_uri(args.root) else os.path.abspath(args.root)
    if args.command == "generate":
        print(generate(root, hour, args.files, args.rows))
        return 0
    # Airflow's home (its SQLite database, the run's log) is a local directory, whatever the root
    airflow_home = args.airflow_home or (os.path.expanduser("~/streambatch-demo/airflow") if _is_uri(root)
                                         else os.path.join(root, "airflow"))
    summary = run(args.dag, root, hour, os.path.abspath(airflow_home),
                  os.path.abspath(args.dags_folder), args.files, args.rows)
    print(f"\n{args.dag} epoch {hour:%Y-%m-%d %H}:00 UTC: {summary['rows']} rows embedded "
          f"({summary['dimension']} dims) in {summary['seconds']} s, {summary['files']} committed files")
    print(f"  output: {summary['output']}\n  log:    {summary['log']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
