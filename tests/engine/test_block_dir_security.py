"""The block directory is private: another local user can neither read blocks, nor plant
a block directory, nor make the driver act on a path a task stream names (issue 12, #15).

The attacks run as a second local user (``runuser -u nobody``) against real local Spark.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import uuid

import pyarrow as pa
import pytest

import airflow_streambatch.engine as sb
from airflow_streambatch.engine.worker.blocks import write_block
from airflow_streambatch.engine.execution.stream_watcher import ForgedStreamRecordError, StreamWatcher, WatchedTask
from airflow_streambatch.engine.worker.streams import OutputStream

NOBODY = ["runuser", "-u", "nobody", "--"]
needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"),
                                reason="the attacks run as a second user: needs root and runuser")


def _add_one(batch):
    return batch.append_column("y", pa.compute.add(batch["id"], 1))


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture()
def nobody_dir():
    """A directory in /tmp that the user nobody created (as an attacker would, before our run)."""
    path = os.path.join(tempfile.gettempdir(), f"streambatch-attack-{uuid.uuid4().hex[:8]}")
    subprocess.run([*NOBODY, "mkdir", "-m", "755", path], check=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_a_block_dir_another_user_created_is_refused_before_anything_is_written(ctx, nobody_dir):
    ctx.block_dir = nobody_dir
    with pytest.raises(PermissionError, match=rf"{nobody_dir}.*DataContext\.block_dir.*owned by uid 65534"):
        sb.range(100, override_num_blocks=4).map_batches(_add_one).take_all()
    assert os.listdir(nobody_dir) == []  # no run directory for the attacker to swap


def test_a_group_writable_block_dir_from_the_environment_is_refused(ctx, tmp_path, monkeypatch):
    from airflow_streambatch.engine.context import _default_block_dir

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    monkeypatch.setenv("STREAMBATCH_BLOCK_DIR", str(shared))
    ctx.block_dir = _default_block_dir()
    with pytest.raises(PermissionError, match=r"STREAMBATCH_BLOCK_DIR.*mode 0775 lets group or others write"):
        sb.range(100, override_num_blocks=4).map_batches(_add_one).take_all()


def test_the_default_block_dir_is_per_user(monkeypatch):
    from airflow_streambatch.engine.context import _default_block_dir

    monkeypatch.delenv("STREAMBATCH_BLOCK_DIR", raising=False)
    assert os.path.basename(_default_block_dir()) == f"streambatch-{os.geteuid()}"


@needs_root
def test_blocks_are_private_to_the_user_even_under_a_world_readable_parent(ctx):
    parent = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.chmod(parent, 0o755)  # nobody may traverse it: only the block dir's own modes protect the blocks
        ctx.block_dir = os.path.join(parent, "blocks")
        kept = sb.range(100, override_num_blocks=4).map_batches(_add_one).materialize()
        paths = [ref.path for ref in kept._refs]
        run_dir = os.path.dirname(paths[0])
        assert sorted(r["y"] for r in kept.take_all()) == list(range(1, 101))
        assert _mode(ctx.block_dir) == _mode(run_dir) == _mode(os.path.join(run_dir, "streams")) == 0o700
        assert {_mode(p) for p in paths} == {_mode(os.path.join(run_dir, "_driver"))} == {0o600}
        for path in (ctx.block_dir, paths[0]):
            peek = subprocess.run([*NOBODY, "cat", path], capture_output=True)
            assert peek.returncode != 0 and b"Permission denied" in peek.stderr
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_stream_and_grant_files_are_created_0600(tmp_path):
    (tmp_path / "streams").mkdir()
    out = OutputStream(str(tmp_path), "0-p00000-0", granted=0, poll_s=0.001)
    out.finish(0)
    watcher = StreamWatcher(str(tmp_path))
    task = WatchedTask(0, "p00000", "0-p00000-0", 0, 0.0, 0)
    watcher.watch(task)
    watcher.grant(task, 1)
    assert _mode(out.path) == _mode(out.grant_path) == 0o600


def _secret(path) -> bytes:
    """A root-only Arrow file outside the run dir: what a forged record points the driver at."""
    write_block(pa.table({"id": [-1, -2, -3], "y": [0, 0, 0]}), str(path))
    os.chmod(path, 0o600)
    return path.read_bytes()


def _forged(op_index: int, task_key: str, path: str, index: int = 7) -> dict:
    return {"block": {"block_id": f"{op_index}:{task_key}:{index}", "path": path, "num_rows": 3,
                      "size_bytes": 48, "producer": ["Forged", task_key, index], "partitions": [0],
                      "offset": 0, "length": None}}


@pytest.mark.parametrize("how", ["outside the run dir", "a link with the right name", "another task's name"])
def test_stream_watcher_refuses_a_forged_block_record_and_leaves_the_file_alone(tmp_path, how):
    secret = tmp_path / "root-only.arrow"
    content = _secret(secret)
    run_dir = tmp_path / "run-x"
    (run_dir / "streams").mkdir(parents=True)
    watcher = StreamWatcher(str(run_dir))
    watcher.watch(WatchedTask(1, "p00003", "1-p00003-5", 10, 0.0, 0))
    target = str(secret)
    if how == "a link with the right name":
        target = str(run_dir / "1-p00003-7.arrow")
        os.symlink(secret, target)
    elif how == "another task's name":
        target = str(run_dir / "1-p00004-7.arrow")
        shutil.copy(secret, target)
    (run_dir / "streams" / "1-p00003-5.stream").write_text(json.dumps(_forged(1, "p00003", target)) + "\n")
    with pytest.raises(ForgedStreamRecordError, match="task p00003 of operator 1"):
        watcher.poll()
    assert secret.read_bytes() == content and _mode(secret) == 0o600


def test_a_forged_record_in_a_running_tasks_stream_stops_the_run_and_the_file_survives(ctx, tmp_path):
    """Another process appends a record to a running task's stream (here the task's own
    UDF, as any process that could write there would): before the fix the driver read
    the named file into the output, then deleted it."""
    secret = tmp_path / "root-only.arrow"
    content = _secret(secret)
    block_dir = ctx.block_dir

    def forge(batch):
        if 10 in batch["id"].to_pylist():  # partition 0's third batch: its stream holds its first blocks
            import glob
            import time

            streams = glob.glob(os.path.join(block_dir, "run-*", "streams", "*.stream"))
            assert streams, "the task announced no block yet"
            for path in streams:
                op_index, rest = os.path.basename(path)[: -len(".stream")].split("-", 1)
                with open(path, "a") as f:
                    f.write(json.dumps(_forged(int(op_index), rest.rsplit("-", 1)[0], str(secret))) + "\n")
            time.sleep(1)  # let the driver poll the forged record before the task ends
        return _add_one(batch)

    ctx.target_max_block_size = 64  # a block per few rows: blocks stream out while the task runs
    with pytest.raises(ForgedStreamRecordError, match=r"task p\d+ of operator \d+ announced a block"):
        sb.range(100, override_num_blocks=4).map_batches(forge, batch_size=5).take_all()
    assert secret.read_bytes() == content
