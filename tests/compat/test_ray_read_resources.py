"""Ray's resource arguments on every built-in ``read_*`` (issue 32): ``num_cpus=``, ``num_gpus=``,
``memory=``, ``ray_remote_args=`` and ``concurrency=``, as Ray's file reads hand them to
``read_datasource``. Each becomes the read tasks' request (`read_resources.with_read_resources`);
``concurrency`` caps the read tasks running at once, seen on real local Spark through a filesystem
whose opens take 0.3 s and record when they ran, on the executors; and on the tests' S3 server.
"""

from __future__ import annotations

import inspect
import json
import os
import time

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from counting_fs import CountingHandler

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.plan.planner import plan


class SlowOpens(CountingHandler):
    """Local files whose every stream opened in a Spark task (not in this driver) takes ``sleep_s``
    and leaves a file saying when it ran: the read tasks' spans."""

    def __init__(self, inner: pafs.FileSystem, log_dir: str, sleep_s: float = 0.3, driver_pid: int = 0):
        super().__init__(inner, log_dir)
        self.sleep_s, self.driver_pid = sleep_s, driver_pid or os.getpid()

    def __reduce__(self):
        return SlowOpens, (self.inner, self.log_dir, self.sleep_s, self.driver_pid)

    def open_input_stream(self, path):
        if os.getpid() != self.driver_pid:
            start = time.time()
            time.sleep(self.sleep_s)
            with open(os.path.join(self.log_dir, f"{os.getpid()}-{time.time_ns()}.span"), "w") as f:
                f.write(f"{start} {time.time()}")
        return self.inner.open_input_stream(path)


def _most_at_once(spans: str) -> tuple[int, int]:
    """(spans recorded, the most that overlapped)."""
    found = [tuple(map(float, open(os.path.join(spans, n)).read().split())) for n in os.listdir(spans)
             if n.endswith(".span")]
    return len(found), max((sum(a <= start < b for a, b in found) for start, _ in found), default=0)


def _request(ds) -> tuple[dict, int | None]:
    read = plan(ds._logical)[0]
    return read.compute.as_dict(), read.compute.concurrency


def _inputs(root) -> dict:
    """One small input per built-in read, each its own function's format."""
    os.makedirs(root, exist_ok=True)
    table = pa.table({"id": [1, 2, 3]})
    pq.write_table(table, f"{root}/in.parquet")
    pacsv.write_csv(table, f"{root}/in.csv")
    with open(f"{root}/in.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in table.to_pylist())
    with open(f"{root}/in.txt", "w") as f:
        f.write("1\n2\n3\n")
    return {rd.read_parquet: f"{root}/in.parquet", rd.read_csv: f"{root}/in.csv", rd.read_json: f"{root}/in.jsonl",
            rd.read_text: f"{root}/in.txt", rd.read_binary_files: f"{root}/in.txt"}


def test_every_read_asks_for_rays_resource_arguments(tmp_path):
    for read, path in _inputs(tmp_path).items():
        assert plan(read(path)._logical)[0].compute.as_dict() == {"CPU": 1.0}  # the default: one CPU, no cap
        assert _request(read(path, num_cpus=2, concurrency=3)) == ({"CPU": 2.0}, 3), read.__name__
        assert _request(read(path, num_gpus=1)) == ({"GPU": 1.0}, None)  # as map_batches: no CPU slot asked
        assert _request(read(path, num_cpus=0.5, ray_remote_args={  # Ray's merge: the explicit argument wins
            "num_cpus": 4, "resources": {"disk": 1}, "scheduling_strategy": "SPREAD"})) == (
            {"CPU": 0.5, "disk": 1.0}, None)
        assert _request(read(path, ray_remote_args={"num_gpus": 0.25, "num_cpus": 0})) == ({"GPU": 0.25}, None)
        assert plan(read(path, memory=1 << 20)._logical)[0].compute.as_dict() == {"CPU": 1.0}  # checked only
        assert "concurrency=None" in str(inspect.signature(read))  # help() shows them


@pytest.mark.parametrize("args,error,message", [
    ({"concurrency": 0}, ValueError, r"concurrency must be a positive integer"),
    ({"num_cpus": -1}, ValueError, r"num_cpus must be a number >= 0"),
    ({"num_cpus": 0}, ValueError, r"a task must request some resource"),
    ({"memory": "1GB"}, ValueError, r"memory must be a number of bytes"),
    ({"ray_remote_args": {"num_cpu": 1}}, ValueError, r"Invalid option keyword num_cpu for remote functions"),
    ({"ray_remote_args": [("num_cpus", 1)]}, TypeError, r"ray_remote_args must be a dict"),
])
def test_reads_refuse_bad_resource_arguments_naming_the_read(tmp_path, args, error, message):
    for read, path in _inputs(tmp_path).items():
        with pytest.raises(error, match=message) as caught:
            read(path, **args)
        assert caught.value.args[0].startswith(read.__name__), caught.value
    with pytest.raises(TypeError, match="compute"):  # Ray's file reads take no compute= (read_datasource does)
        rd.read_csv(f"{tmp_path}/in.csv", compute=rd.TaskPoolStrategy(size=2))


def test_concurrency_caps_the_read_tasks_running_at_once(ctx, tmp_path):
    paths = []
    for i in range(4):
        paths.append(str(tmp_path / f"part{i}.txt"))
        with open(paths[-1], "w") as f:
            f.write("".join(f"{i}-{j}\n" for j in range(5)))
    want = sorted(f"{i}-{j}" for i in range(4) for j in range(5))
    capped, halves = tmp_path / "capped", tmp_path / "halves"
    slow = {name: pafs.PyFileSystem(SlowOpens(pafs.LocalFileSystem(), str(tmp_path / name))) for name in
            ("capped", "halves")}
    capped.mkdir()
    halves.mkdir()
    ds = rd.read_text(paths, filesystem=slow["capped"], concurrency=1, override_num_blocks=4)
    assert sorted(row["text"] for row in ds.take_all()) == want
    assert _most_at_once(str(capped)) == (4, 1)  # four read tasks (a cap, not fewer tasks), one at a time
    ds = rd.read_text(paths, filesystem=slow["halves"], num_cpus=2, override_num_blocks=4)  # 4 CPU slots
    assert sorted(row["text"] for row in ds.map(lambda row: row).take_all()) == want  # a map after: its own tasks
    spans, most = _most_at_once(str(halves))
    assert spans == 4 and most <= 2
    with pytest.raises(ValueError, match=r"ReadText asks for GPU=1 per task but only 0 GPU slot\(s\) exist"):
        rd.read_text(paths, num_gpus=1).take_all()  # refused before any task runs, naming the read


def test_resource_arguments_on_a_parquet_read_from_s3(ctx, s3_bucket):
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    for i in range(3):
        pq.write_table(pa.table({"id": list(range(i * 10, i * 10 + 10))}), f"{bucket}/in/f{i}.parquet", filesystem=fs)
    ds = rd.read_parquet(f"{s3_bucket}/in", concurrency=1, num_cpus=2, ray_remote_args={"max_retries": 3})
    assert _request(ds) == ({"CPU": 2.0}, 1)
    assert sorted(row["id"] for row in ds.take_all()) == list(range(30))
