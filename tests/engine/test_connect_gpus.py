"""GPU operators through a Spark Connect server in front of a real standalone cluster (`spark/connect_profiles.py`).

The cluster of `test_cluster_gpus.py`: worker 0 offers two (pretend) GPUs through a
discovery script, worker 1 none; dynamic allocation on, so a GPU operator's launches run
under an executor resource profile created through the Connect session, on executors
Spark starts on worker 0 only. Each UDF call leaves a note (its working directory, which
names the worker, ``CUDA_VISIBLE_DEVICES`` and ``TaskContext.resources()``): GPU tasks must
hold the address Spark assigned them, CPU tasks none. A request no worker can serve is
refused at start, naming the workers' setting.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as sb
from ports import free_port
from standalone_cluster import StandaloneCluster
from test_cluster_gpus import DYNAMIC, _discovery_script, _notes

HERE = os.path.dirname(os.path.abspath(__file__))
FILES, ROWS = 6, 10
PLACE_WAIT = "15s"  # how long a profile's probe task may wait for an executor (spark.scheduler.maxRegistered...)


class Where:
    """A UDF that passes its batch on and records where it ran and what it held (one JSON file per call)."""

    def __init__(self, kind: str, notes: str):
        self.kind, self.notes = kind, notes

    def __call__(self, batch):
        from pyspark import TaskContext

        start = time.time()
        time.sleep(0.2)  # long enough for two GPU tasks to overlap, if they could
        note = {"kind": self.kind, "ids": batch["id"].to_pylist(), "cwd": os.getcwd().split(os.sep),
                "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start, "end": time.time(),
                "resources": {n: list(i.addresses) for n, i in TaskContext.get().resources().items()}}
        with open(os.path.join(self.notes, f"{self.kind}-{uuid.uuid4().hex}.json"), "w") as f:
            json.dump(note, f)
        return batch


@pytest.fixture(scope="module")
def connect_cluster(tmp_path_factory):
    """A Connect session to a server whose master is the mixed cluster, with dynamic allocation."""
    from pyspark.sql.connect.session import SparkSession

    from airflow_streambatch.engine.spark.connect_server import start_connect_server, stop_connect_server

    work = tmp_path_factory.mktemp("connect-gpu-cluster")
    gpus = {"spark.worker.resource.gpu.amount": "2",
            "spark.worker.resource.gpu.discoveryScript": _discovery_script(work)}
    cluster = StandaloneCluster(str(work), workers=2, cores=2, memory="1g", worker_conf={0: gpus})
    port, log = free_port(), open(work / "connect-server.log", "wb")
    conf = {**DYNAMIC, "spark.ui.enabled": "false", "spark.executor.memory": "512m",
            "spark.executorEnv.PYTHONPATH": f"{HERE}:{os.path.dirname(HERE)}",  # the UDF's module, and ports.py
            "spark.scheduler.maxRegisteredResourcesWaitingTime": PLACE_WAIT}
    cluster.start()  # both workers first: an application that found one would put both CPU executors there
    server = start_connect_server(cluster.url, port, log, conf)
    session = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").create()
    try:
        yield session
    finally:
        session.stop()
        stop_connect_server(server)
        cluster.stop()
        log.close()


@pytest.fixture()
def dirs(tmp_path) -> dict:
    source = tmp_path / "in"
    source.mkdir()
    for f in range(FILES):
        pq.write_table(pa.table({"id": list(range(f * ROWS, (f + 1) * ROWS))}), source / f"f{f:02d}.parquet")
    (tmp_path / "notes").mkdir()
    return {"source": str(source), "output": str(tmp_path / "out"), "blocks": str(tmp_path / "blocks"),
            "notes": str(tmp_path / "notes")}


def test_gpu_tasks_through_connect_hold_the_gpu_spark_assigned_them(connect_cluster, dirs):
    ds = (sb.read_parquet(dirs["source"], override_num_blocks=FILES)
          .map_batches(Where, fn_constructor_args=("cpu", dirs["notes"]), batch_format="pyarrow")
          .map_batches(Where, num_gpus=1, concurrency=2, fn_constructor_args=("gpu", dirs["notes"]),
                       batch_format="pyarrow"))
    with sb.DataContext(block_dir=dirs["blocks"]).scoped():
        rows = ds.take_all()
    assert sorted(r["id"] for r in rows) == list(range(FILES * ROWS))
    gpu, cpu = _notes(dirs, "gpu"), _notes(dirs, "cpu")
    assert {i for n in gpu for i in n["ids"]} == set(range(FILES * ROWS))
    for note in gpu:
        assert "worker-0" in note["cwd"], f"a GPU task ran on a worker without GPUs: {note}"
        assert len(note["resources"].get("gpu", [])) == 1, f"Spark assigned no single GPU: {note}"
        assert note["cuda"] == note["resources"]["gpu"][0], f"CUDA_VISIBLE_DEVICES is not Spark's address: {note}"
    for a in gpu:
        for b in gpu:
            if a is not b and a["cuda"] == b["cuda"]:
                assert a["end"] <= b["start"] or b["end"] <= a["start"], f"two tasks at once on GPU {a['cuda']}"
    assert cpu, "no CPU task left a note"
    for note in cpu:
        assert "gpu" not in note["resources"] and not note["cuda"], f"a CPU task holds a GPU: {note}"


def test_a_request_no_worker_can_serve_is_refused_at_start_naming_the_setting(connect_cluster, dirs):
    from airflow_streambatch.engine.spark.profiles import ClusterResourcesError

    ds = (sb.read_parquet(dirs["source"], override_num_blocks=FILES)
          .map_batches(Where, resources={"tpu": 1}, fn_constructor_args=("tpu", dirs["notes"]),
                       batch_format="pyarrow"))
    started = time.monotonic()
    with sb.DataContext(block_dir=dirs["blocks"]).scoped(), pytest.raises(
            ClusterResourcesError, match=r"asks for tpu, and Spark placed no task of that request within 15 s.*"
                                         r"spark\.worker\.resource\.tpu\.amount"):
        ds.take_all()
    assert time.monotonic() - started < 60
    assert not os.listdir(dirs["notes"]), "tasks ran before the error"


def test_the_launch_function_marks_its_tasks_as_the_worker_reads_it():
    """The worker layer imports nothing from spark/, so it names the variable by its literal."""
    import inspect

    from airflow_streambatch.engine.spark.profiles import SPARK_RESOURCES_ENV, profile_requests
    from airflow_streambatch.engine.worker.task_runner import _task_gpus

    assert f'"{SPARK_RESOURCES_ENV}"' in inspect.getsource(_task_gpus)
    shared = profile_requests("executor", {"gpu": 0.25}, 1, 2)  # the classic and the Connect profile's requests
    assert (shared.cpus, shared.task, shared.executor_cores, shared.executor) == (1, {"gpu": 0.25}, 2, {"gpu": 1})
    assert profile_requests("task", {"gpu": 1}).executor is None


def test_settings_that_cannot_place_a_request_are_refused_naming_them():
    """The checks a Connect session makes from its settings alone (shared with classic sessions)."""
    from airflow_streambatch.engine.spark.profiles import (
        ClusterResourcesError,
        check_requests,
        check_static_executor_settings,
    )

    needs = check_requests(["spark.executor.cores"], {"cpu": {"CPU": 1}, "a": {"GPU": 1}, "b": {"GPU": 2}})
    assert needs == {"gpu": ("b", 2.0)}  # the largest ask is what executors must own
    with pytest.raises(ClusterResourcesError, match=r"spark\.task\.resource\.gpu\.amount is set"):
        check_requests(["spark.task.resource.gpu.amount"], {"a": {"GPU": 1}})
    with pytest.raises(ClusterResourcesError, match=r"num_gpus=0.75.*use num_gpus=0.5 or 1"):
        check_requests([], {"a": {"GPU": 0.75}})
    with pytest.raises(ClusterResourcesError, match=r"spark\.dynamicAllocation\.enabled=true.*"
                                                    r"spark\.executor\.resource\.gpu\.amount"):
        check_static_executor_settings({}.get, needs)
    with pytest.raises(ClusterResourcesError, match=r"b asks for 2 gpu per task, but each executor owns 1 "
                                                    r"\(spark\.executor\.resource\.gpu\.amount\)"):
        check_static_executor_settings({"spark.executor.resource.gpu.amount": "1"}.get, needs)
    check_static_executor_settings({"spark.executor.resource.gpu.amount": "2"}.get, needs)
