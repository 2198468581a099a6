"""The block directory is private: another local user can neither read blocks, nor plant
a block directory, nor make the driver act on a path a task stream names (issue 12, #15);
the control plane refuses calls without the run's secret (issue 14).

The attacks run as a second local user (``runuser -u nobody``) against real local Spark.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid

import pyarrow as pa
import pytest

import airflow_streambatch.engine as sb
import pyarrow.flight as flight

from airflow_streambatch.engine.execution.control_server import ControlServer
from airflow_streambatch.engine.execution.stream_watcher import ForgedStreamRecordError, StreamWatcher, WatchedTask
from airflow_streambatch.engine.worker.blocks import write_block
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.protocol.streams import StreamId
from airflow_streambatch.engine.worker.control_client import call

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
        sb.range(100, override_num_blocks=4).map_batches(_add_one, batch_format="pyarrow").take_all()
    assert os.listdir(nobody_dir) == []  # no run directory for the attacker to swap


def test_a_group_writable_block_dir_from_the_environment_is_refused(ctx, tmp_path, monkeypatch):
    from airflow_streambatch.engine.context import _default_block_dir

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)
    monkeypatch.setenv("STREAMBATCH_BLOCK_DIR", str(shared))
    ctx.block_dir = _default_block_dir()
    with pytest.raises(PermissionError, match=r"STREAMBATCH_BLOCK_DIR.*mode 0775 lets group or others write"):
        sb.range(100, override_num_blocks=4).map_batches(_add_one, batch_format="pyarrow").take_all()


def test_the_default_block_dir_is_per_user(monkeypatch):
    from airflow_streambatch.engine.context import _default_block_dir

    monkeypatch.delenv("STREAMBATCH_BLOCK_DIR", raising=False)
    assert os.path.basename(_default_block_dir()) == f"streambatch-{os.geteuid()}"


@needs_root
def test_a_dev_shm_too_small_for_the_default_memory_limit_is_not_the_default(tmp_path):
    """A container's 64 MiB /dev/shm (here a mount namespace's) cannot hold a quarter of the machine's
    memory: the default goes to the temp directory, so defaults never fail the check at start."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    code = ("import tempfile; from airflow_streambatch.engine.context import DataContext; "
            "from airflow_streambatch.engine.worker.block_room import check_block_room; c = DataContext(); "
            "check_block_room(c.block_dir, c.memory_limit); print(c.block_dir, tempfile.gettempdir())")
    env = {k: v for k, v in os.environ.items() if k != "STREAMBATCH_BLOCK_DIR"}
    found = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" -c "$1"', sys.executable, code],
                           capture_output=True, text=True, env=env, timeout=60)
    assert found.returncode == 0, found.stderr
    block_dir, temp = found.stdout.split()
    assert block_dir == os.path.join(temp, f"streambatch-{os.geteuid()}")


@needs_root
def test_blocks_are_private_to_the_user_even_under_a_world_readable_parent(ctx):
    parent = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        os.chmod(parent, 0o755)  # nobody may traverse it: only the block dir's own modes protect the blocks
        ctx.block_dir = os.path.join(parent, "blocks")
        kept = sb.range(100, override_num_blocks=4).map_batches(_add_one, batch_format="pyarrow").materialize()
        paths = [ref.path for ref in kept._refs]
        run_dir = os.path.dirname(paths[0])
        assert sorted(r["y"] for r in kept.take_all()) == list(range(1, 101))
        assert _mode(ctx.block_dir) == _mode(run_dir) == 0o700
        assert {_mode(p) for p in paths} == {_mode(os.path.join(run_dir, "_driver"))} == {0o600}
        for path in (ctx.block_dir, paths[0]):
            peek = subprocess.run([*NOBODY, "cat", path], capture_output=True)
            assert peek.returncode != 0 and b"Permission denied" in peek.stderr
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="module")
def server():
    control = ControlServer("127.0.0.1")
    yield control
    control.shutdown()


def test_a_control_plane_call_without_the_runs_secret_is_refused(server):
    server.open_stream("0-p00000-0", 0)
    stranger = ControlInfo(server.uri, "not-the-secret", server.driver_id, timeout_s=2)
    with pytest.raises(flight.FlightUnauthenticatedError):
        call(stranger, "stream", {"stream": "0-p00000-0", "record": {"done": 0}})
    assert server.take_records("0-p00000-0") == []


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
def test_stream_watcher_refuses_a_forged_block_record_and_leaves_the_file_alone(tmp_path, server, how):
    """Even a sender with the secret cannot make the driver read or delete a file that is not the task's block."""
    secret = tmp_path / "root-only.arrow"
    content = _secret(secret)
    run_dir = tmp_path / "run-x"
    run_dir.mkdir()
    watcher = StreamWatcher(str(run_dir), server)
    watcher.watch(WatchedTask(StreamId(1, "p00003", 5), 10, 0.0, 0))
    target = str(secret)
    if how == "a link with the right name":
        target = str(run_dir / "1-p00003-7.arrow")
        os.symlink(secret, target)
    elif how == "another task's name":
        target = str(run_dir / "1-p00004-7.arrow")
        shutil.copy(secret, target)
    call(server.info(2), "stream", {"stream": "1-p00003-5", "record": _forged(1, "p00003", target)})
    with pytest.raises(ForgedStreamRecordError, match="task p00003 of operator 1"):
        watcher.poll()
    assert secret.read_bytes() == content and _mode(secret) == 0o600


def test_a_record_from_a_process_without_the_secret_changes_nothing_in_a_running_pipeline(ctx, tmp_path):
    """A process that reaches the driver's control plane but lacks the run's secret (here the
    task's own UDF, with its own client) sends a record naming a file outside the run: it is
    refused, the run finishes with its own rows only, and the file is untouched."""
    secret = tmp_path / "root-only.arrow"
    content = _secret(secret)
    from pyspark.sql import SparkSession

    from airflow_streambatch.engine.execution.control_server import control_server

    driver = control_server(SparkSession.getActiveSession()).info(2)  # certificates are public, the secret is not
    uri, roots = driver.uri, driver.tls_roots
    refused = tmp_path / "refused"

    def forge(batch):
        if 10 in batch["id"].to_pylist():
            stranger = ControlInfo(uri, "guessed", "", timeout_s=2, tls_roots=roots)
            for stream in ("0-p00000-0", "1-p00000-0"):
                try:
                    call(stranger, "stream", {"stream": stream, "record": _forged(0, "p00000", str(secret))})
                except flight.FlightUnauthenticatedError:
                    refused.touch()
        return _add_one(batch)

    ctx.target_max_block_size = 64  # a block per few rows: blocks stream out while the task runs
    rows = sb.range(100, override_num_blocks=4).map_batches(forge, batch_size=5, batch_format="pyarrow").take_all()
    assert sorted(r["y"] for r in rows) == list(range(1, 101))
    assert refused.exists() and secret.read_bytes() == content
