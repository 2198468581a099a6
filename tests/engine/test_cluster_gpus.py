"""GPU operators on a real standalone cluster where only one worker has GPUs.

Worker 0 offers two (pretend) GPUs through a discovery script; worker 1 has none. A
pipeline of a CPU and a GPU operator runs in a driver process of its own (this file run
as a script: a process holds one SparkContext, and the test session's is local), and each
UDF call leaves a note: the worker it ran on, ``CUDA_VISIBLE_DEVICES``, what
``TaskContext.resources()`` assigned, and when it ran. The notes must show GPU tasks only
on worker 0, each on the address Spark assigned and never two at once on one address,
and CPU tasks holding no GPU; the output must hold every row exactly once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
FILES, ROWS = 10, 20  # file f holds ids f*20 .. f*20+19 and is input partition f
SLEEP_S = 0.4  # per UDF call: long enough for GPU tasks to overlap, if they could
DYNAMIC = {  # a heterogeneous cluster (docs/cluster-gpus.md): executors with GPUs only for GPU operators
    "spark.dynamicAllocation.enabled": "true",
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
    "spark.executor.cores": "1",  # an executor of all a worker's cores would leave none for GPU executors there
    # the CPU operators' executors start with the application, one per worker, and stay: an executor
    # that idles out and is started again costs ~10 s here
    "spark.dynamicAllocation.minExecutors": "2",
    "spark.dynamicAllocation.maxExecutors": "2",
}


class Note:
    """A UDF that passes its batch on and records where and when it ran (one JSON file per call)."""

    def __init__(self, kind: str, notes: str, sleep_s: float):
        self.kind, self.notes, self.sleep_s = kind, notes, sleep_s

    def __call__(self, batch):
        from pyspark import TaskContext

        start = time.time()
        time.sleep(self.sleep_s)
        ctx = TaskContext.get()
        note = {
            "kind": self.kind, "ids": batch["id"].to_pylist(), "where": os.getcwd().split(os.sep)[-3:],
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "resources": {name: list(info.addresses) for name, info in ctx.resources().items()},
            "start": start, "end": time.time(),
        }
        with open(os.path.join(self.notes, f"{self.kind}-{uuid.uuid4().hex}.json"), "w") as f:
            json.dump(note, f)
        return batch


def run_job(master: str, conf: dict, dirs: dict) -> dict:
    """The driver: one pipeline on ``master``, in a SparkSession of its own; what happened, as a dict."""
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the executors' interpreter
    from pyspark.sql import SparkSession

    from airflow_streambatch.engine.spark.session import with_spark_defaults

    spark = (
        SparkSession.builder.master(master).appName("streambatch-gpu-test")
        .config("spark.executor.memory", "512m").config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", HERE)
        .config(map=with_spark_defaults({"spark.ui.enabled": "false", **conf}))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel(os.environ.get("GPU_TEST_LOG", "ERROR"))
    import airflow_streambatch.engine as sb

    ds = (sb.read_parquet(dirs["source"], override_num_blocks=FILES)
          .map_batches(Note, fn_constructor_args=("cpu", dirs["notes"], SLEEP_S), batch_format="pyarrow")
          .map_batches(Note, num_gpus=1, concurrency=2, fn_constructor_args=("gpu", dirs["notes"], SLEEP_S),
                       batch_format="pyarrow"))
    progress_s = float(os.environ.get("GPU_TEST_PROGRESS", "0"))  # seconds between progress lines, to debug
    started = time.time()
    try:
        with sb.DataContext(block_dir=dirs["blocks"], progress_interval_s=progress_s).scoped():
            result = ds.write_parquet(dirs["output"])
        summary = {"committed": sorted(result.committed)}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        summary = {"error": f"{type(exc).__name__}: {exc}"}
    summary["wall_s"] = time.time() - started
    spark.stop()
    return summary


if __name__ == "__main__":  # python test_cluster_gpus.py '[{"master": ..., "conf": {...}, "dirs": {...}}, ...]'
    for job in json.loads(sys.argv[1]):  # one after another: a Python process starts its Spark gateway once
        print("RESULT " + json.dumps(run_job(job["master"], job["conf"], job["dirs"])), flush=True)
    sys.exit(0)

# -- the tests ------------------------------------------------------------------------------

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402

from standalone_cluster import StandaloneCluster  # noqa: E402


def _discovery_script(directory) -> str:
    """The fake discovery script, executable (Spark runs it as a program) wherever git left it."""
    path = os.path.join(str(directory), "discover_gpus.sh")
    shutil.copy(os.path.join(HERE, "fake_gpu_discovery.sh"), path)
    os.chmod(path, 0o755)
    return path


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    """Two clusters, started side by side: worker 0 of the first has 2 GPUs, its worker 1 none; the
    second has no GPU at all (one worker of one core)."""
    work = tmp_path_factory.mktemp("gpu-cluster")
    gpus = {"spark.worker.resource.gpu.amount": "2",
            "spark.worker.resource.gpu.discoveryScript": _discovery_script(work)}
    mixed = StandaloneCluster(str(work), workers=2, cores=2, memory="1g", worker_conf={0: gpus})
    plain = StandaloneCluster(str(tmp_path_factory.mktemp("cpu-cluster")), workers=1, cores=1, memory="1g")
    with ThreadPoolExecutor(2) as pool:
        started = [pool.submit(c.start) for c in (mixed, plain)]
    try:
        for future in started:
            future.result()
        yield mixed, plain
    finally:
        mixed.stop()
        plain.stop()


@pytest.fixture()
def dirs(tmp_path) -> dict:
    source = tmp_path / "in"
    source.mkdir()
    for f in range(FILES):
        pq.write_table(pa.table({"id": list(range(f * ROWS, (f + 1) * ROWS))}), source / f"f{f:02d}.parquet")
    (tmp_path / "notes").mkdir()
    return {"source": str(source), "output": str(tmp_path / "out"), "blocks": str(tmp_path / "blocks"),
            "notes": str(tmp_path / "notes")}


def _run(*jobs: tuple[str, dict, dict]) -> list[dict]:
    """Run ``(master, conf, dirs)`` jobs in one driver process; their results."""
    spec = [{"master": master, "conf": conf, "dirs": dirs} for master, conf, dirs in jobs]
    proc = subprocess.run([sys.executable, __file__, json.dumps(spec)], capture_output=True, text=True, timeout=300)
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == len(jobs), f"the driver printed no result:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return results


def _notes(dirs: dict, kind: str) -> list[dict]:
    notes = []
    for name in os.listdir(dirs["notes"]):
        if name.startswith(kind + "-"):
            with open(os.path.join(dirs["notes"], name)) as f:
                notes.append(json.load(f))
    return notes


def _check_placement(dirs: dict) -> tuple[list[dict], list[dict]]:
    """What every run must show: GPU tasks on worker 0 with the address Spark assigned, never two at
    once on one address; CPU tasks without a GPU; every row exactly once in the output."""
    gpu, cpu = _notes(dirs, "gpu"), _notes(dirs, "cpu")
    assert {i for n in gpu for i in n["ids"]} == set(range(FILES * ROWS))
    for note in gpu:
        assert note["where"][0] == "worker-0", f"a GPU task ran on a worker without GPUs: {note}"
        assert len(note["resources"].get("gpu", [])) == 1, f"Spark assigned no single GPU: {note}"
        assert note["cuda"] == note["resources"]["gpu"][0], f"CUDA_VISIBLE_DEVICES is not Spark's address: {note}"
    for a in gpu:
        for b in gpu:
            if a is not b and a["cuda"] == b["cuda"]:
                assert a["end"] <= b["start"] or b["end"] <= a["start"], f"two tasks at once on GPU {a['cuda']}"
    assert cpu, "no CPU task left a note"
    for note in cpu:
        assert "gpu" not in note["resources"] and not note["cuda"], f"a CPU task holds a GPU: {note}"
    assert sorted(pq.read_table(dirs["output"])["id"].to_pylist()) == list(range(FILES * ROWS))
    return gpu, cpu


def test_gpu_operators_run_only_where_the_gpus_are(clusters, dirs):
    """Dynamic allocation: GPU tasks get executors of their own on worker 0; CPU tasks use both workers."""
    [result] = _run((clusters[0].url, DYNAMIC, dirs))
    assert result.get("committed") == list(range(FILES)), result
    gpu, cpu = _check_placement(dirs)
    assert {n["where"][0] for n in cpu} == {"worker-0", "worker-1"}, "CPU tasks did not use both workers"
    assert not {n["where"][2] for n in cpu} & {n["where"][2] for n in gpu}, "CPU and GPU tasks shared an executor"


def test_executors_that_own_gpus_no_longer_crash_the_engine(clusters, dirs):
    """``spark.executor.resource.gpu.amount`` used to fail before any task (``len`` of a JavaObject).
    With dynamic allocation off every executor owns a GPU (tasks of GPU operators run under a task
    resource profile on them), so only worker 0 gets executors."""
    [result] = _run((clusters[0].url, {"spark.executor.resource.gpu.amount": "1", "spark.executor.cores": "1"}, dirs))
    assert result.get("committed") == list(range(FILES)), result
    _, cpu = _check_placement(dirs)
    assert {n["where"][0] for n in cpu} == {"worker-0"}  # the price: the CPU-only worker idles


def test_a_gpu_pipeline_that_no_executor_can_run_fails_at_start_naming_the_setting(clusters, dirs):
    """Dynamic allocation off and executors without GPUs; or a cluster without GPUs at all."""
    mixed, plain = clusters
    no_gpu_executors, no_gpu_workers = _run((mixed.url, {"spark.executor.cores": "1"}, dirs),
                                            (plain.url, DYNAMIC, dirs))
    assert "spark.dynamicAllocation.enabled" in no_gpu_executors["error"], no_gpu_executors
    assert "spark.executor.resource.gpu.amount" in no_gpu_executors["error"], no_gpu_executors
    assert "spark.worker.resource.gpu.amount" in no_gpu_workers["error"], no_gpu_workers
    assert not os.listdir(dirs["notes"]), "tasks ran before the error"


def test_executors_of_a_gpu_profile_own_what_their_tasks_use():
    from airflow_streambatch.engine.spark.profiles import executor_shape, spark_resources

    assert spark_resources({"CPU": 1}) == {}
    assert spark_resources({"GPU": 0.25, "tpu": 2}) == {"gpu": 0.25, "tpu": 2.0}
    assert executor_shape({"gpu": 1}) == (1, {"gpu": 1})  # one task, one GPU
    assert executor_shape({"gpu": 2}, cpus_per_task=2) == (2, {"gpu": 2})
    assert executor_shape({"gpu": 0.25}) == (4, {"gpu": 1})  # four tasks share one GPU
    assert executor_shape({"gpu": 0.25}, executor_cores=2) == (2, {"gpu": 1})  # two, where executors have 2 cores
    assert executor_shape({"gpu": 0.5, "tpu": 1}) == (1, {"gpu": 1, "tpu": 1})  # the whole tpu allows one


def test_tasks_read_the_mark_the_backend_puts_on_cluster_jobs():
    """The worker layer imports nothing from spark/, so it names the local property by its literal."""
    import inspect

    from airflow_streambatch.engine.spark.profiles import SPARK_RESOURCES_PROPERTY
    from airflow_streambatch.engine.worker.task_runner import _task_gpus

    assert f'"{SPARK_RESOURCES_PROPERTY}"' in inspect.getsource(_task_gpus)
