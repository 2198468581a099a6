"""PartitionTracker (when a partition commits, and that a failed one never does) and StreamWatcher
(announced blocks, waits, forged records): the driver-side bookkeeping, without Spark. Task
records travel over a real control plane (an Arrow Flight `ControlServer` on 127.0.0.1).

Forged records that point outside the run dir, at a link, or at another task's file
are covered in test_block_dir_security.py; here are the other ways a record can lie.
"""

from __future__ import annotations

import itertools
import json
import os

import pyarrow as pa
import pyarrow.flight as flight
import pyarrow.parquet as pq
import pytest

from airflow_streambatch.engine.errors import PartitionFailure
from airflow_streambatch.engine.output.commit import PartitionCommitter
from airflow_streambatch.engine.output.target import OutputTarget
from airflow_streambatch.engine.execution.control_server import ControlServer
from airflow_streambatch.engine.execution.partitions import PartitionTracker
from airflow_streambatch.engine.execution.stream_watcher import ForgedStreamRecordError, StreamWatcher, WatchedTask
from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.worker.control_client import call
from airflow_streambatch.engine.protocol.staging import StagedFile, schema_columns
from airflow_streambatch.engine.protocol.streams import StreamId
from airflow_streambatch.engine.worker.streams import OutputStream


# -- PartitionTracker -------------------------------------------------------------------------


def bref(block_id: str, *partitions: int) -> BlockRef:
    return BlockRef(block_id=block_id, path=f"/nowhere/{block_id}", num_rows=1, size_bytes=1,
                    producer=("Op", block_id, 0), partitions=tuple(partitions))


def failure(partition: int, error: str = "boom") -> PartitionFailure:
    return PartitionFailure(partition, f"file{partition}", "Map(f)", error)


def test_tracker_counts_reads_and_held_blocks():
    tracker = PartitionTracker(None)
    tracker.add_read(0, "a.parquet")
    assert tracker.outstanding[0] == 1 and tracker.label(0) == "a.parquet" and tracker.label(7) == "partition 7"
    block = bref("b1", 0)
    tracker.hold(block)
    tracker.hold(block)  # queued again downstream: still one thing outstanding
    assert tracker.outstanding[0] == 2
    tracker.read_done(0)
    tracker.drop(block)
    tracker.drop(block)  # dropped twice: counted once
    assert tracker.outstanding[0] == 0
    tracker.drop(bref("never-held", 0))
    assert tracker.outstanding[0] == 0


def test_tracker_mixed_blocks_hold_every_partition():
    tracker = PartitionTracker(None)
    mixed = bref("m", 1, 2)
    tracker.hold(mixed)
    assert (tracker.outstanding[1], tracker.outstanding[2]) == (1, 1)
    tracker.drop(mixed)
    assert (tracker.outstanding[1], tracker.outstanding[2]) == (0, 0)


def test_tracker_failures_keep_the_first_reason():
    tracker = PartitionTracker(None)
    tracker.fail(failure(3, "first"))
    tracker.fail(failure(3, "second"))
    assert tracker.failures[3].error == "first"
    assert tracker.is_failed((1, 3)) and not tracker.is_failed((1, 2)) and not tracker.is_failed(())


def stage(committer: PartitionCommitter, partition: int, table: pa.Table, name: str = "part-t.parquet"):
    directory = committer.staging_dir(partition)
    os.makedirs(directory, exist_ok=True)
    path = f"{directory}/{name}"
    pq.write_table(table, path)
    return StagedFile(path, table.num_rows, os.path.getsize(path), schema_columns(table.schema))


@pytest.fixture()
def committer(tmp_path):
    with OutputTarget.open(str(tmp_path / "out")) as target:
        c = target.committer("r1")
        c.claim_staging()
        yield c


def test_a_partition_commits_once_its_read_is_done_and_its_last_block_dropped(committer):
    tracker = PartitionTracker(committer, sink_name="Write")
    seen = []
    tracker.on_commit = seen.append
    tracker.add_read(0, "in/a.parquet", identity="fp-a")
    first, second = bref("b1", 0), bref("b2", 0)
    tracker.hold(first)
    tracker.add_files((0,), [stage(committer, 0, pa.table({"x": [1, 2, 3]}))])
    tracker.read_done(0)
    tracker.hold(second)
    tracker.drop(first)
    assert tracker.committed == {} and committer.committed() == {}  # a block still in flight
    tracker.drop(second)
    record = tracker.committed[0]
    assert record.rows == 3 and record.label == "in/a.parquet" and record.inputs == "fp-a"
    assert record.files == ["p00000/part-t.parquet"] and seen == [record]
    assert committer.committed()[0].rows == 3
    assert pq.read_table(os.path.join(committer.root, "p00000", "part-t.parquet")).num_rows == 3
    assert 0 not in tracker.files


def test_a_partition_with_no_blocks_commits_when_its_read_is_done(committer):
    tracker = PartitionTracker(committer)
    tracker.add_read(4, "empty.parquet")
    tracker.read_done(4)
    assert tracker.committed[4].rows == 0 and 4 in committer.committed()


def test_partitions_commit_independently(committer):
    tracker = PartitionTracker(committer)
    for p in (0, 1):
        tracker.add_read(p, f"f{p}")
    held = bref("b", 0)
    tracker.hold(held)
    tracker.read_done(0)
    tracker.read_done(1)
    assert set(tracker.committed) == {1}
    tracker.drop(held)
    assert set(tracker.committed) == {0, 1}


def test_a_failed_partition_never_commits(committer):
    tracker = PartitionTracker(committer)
    tracker.on_commit = lambda rec: pytest.fail(f"committed {rec}")
    tracker.add_read(2, "bad.parquet")
    block = bref("b", 2)
    tracker.hold(block)
    tracker.add_files((2,), [stage(committer, 2, pa.table({"x": [1]}))])
    tracker.fail(failure(2))
    tracker.read_done(2)
    tracker.drop(block)
    assert tracker.committed == {} and committer.committed() == {}
    assert not os.path.exists(os.path.join(committer.root, "p00002"))


def test_a_schema_mismatch_fails_the_partition_instead_of_committing(committer):
    tracker = PartitionTracker(committer, sink_name="WriteParquet")
    tracker.add_read(0, "a")
    tracker.add_read(1, "b")
    tracker.add_files((0,), [stage(committer, 0, pa.table({"x": [1]}))])
    tracker.add_files((1,), [stage(committer, 1, pa.table({"x": ["one"]}))])
    tracker.read_done(0)
    tracker.read_done(1)
    assert set(tracker.committed) == {0}
    assert tracker.failures[1].operator == "WriteParquet" and "SchemaMismatchError" in tracker.failures[1].error
    assert set(committer.committed()) == {0}


def test_an_on_commit_callback_that_raises_does_not_undo_the_commit(committer):
    tracker = PartitionTracker(committer)

    def broken(record):
        raise RuntimeError("observer bug")

    tracker.on_commit = broken
    tracker.add_read(0, "a")
    tracker.read_done(0)
    assert 0 in tracker.committed and 0 not in tracker.failures and 0 in committer.committed()


# -- StreamWatcher -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    control = ControlServer("127.0.0.1")
    yield control
    control.shutdown()


@pytest.fixture()
def run_dir(tmp_path):
    d = tmp_path / "run-1"
    d.mkdir()
    return str(d)


_launches = itertools.count(1)  # one stream name per task of the module: the server is shared


def task_block(run_dir, op_index, key, index, size=8, write=True, **changes) -> BlockRef:
    path = os.path.join(run_dir, f"{op_index}-{key}-{index}.arrow")
    if write:
        with open(path, "wb") as f:
            f.write(b"arrow")
    fields = dict(block_id=f"{op_index}:{key}:{index}", path=path, num_rows=2, size_bytes=size,
                  producer=(f"Op{op_index}", key, index), partitions=(0,))
    fields.update(changes)
    return BlockRef(**fields)


def watched(watcher, op_index, key, granted=100) -> tuple[WatchedTask, OutputStream]:
    task = WatchedTask(StreamId(op_index, key, next(_launches)), granted, 0.0, 0)
    watcher.watch(task)
    return task, OutputStream(watcher.server.info(timeout_s=5), task.name, granted=granted)


def send(out: OutputStream, record: dict) -> dict:
    """Send ``record`` on the task's stream as any holder of the run's secret could, whatever it says."""
    return call(out.control, "stream", {"stream": out.name, "record": record})


def block_record(ref: BlockRef) -> dict:
    return {**ref.__dict__, "producer": list(ref.producer), "partitions": list(ref.partitions)}


def test_poll_returns_announced_blocks_in_order(server, run_dir):
    watcher = StreamWatcher(run_dir, server)
    assert watcher.poll() == []
    a, out_a = watched(watcher, 1, "ka")
    b, out_b = watched(watcher, 2, "kb")
    assert watcher.poll() == []  # nothing written yet
    refs_a = [task_block(run_dir, 1, "ka", i, size=10 + i) for i in range(3)]
    ref_b = task_block(run_dir, 2, "kb", 0)
    for r in refs_a[:2]:
        out_a.announce(r)
    out_b.announce(ref_b)
    first = watcher.poll()
    assert [(t.task_key, r) for t, r in first if t is a] == [("ka", refs_a[0]), ("ka", refs_a[1])]
    assert [(t.task_key, r) for t, r in first if t is b] == [("kb", ref_b)]
    assert watcher.poll() == []  # nothing announced twice
    out_a.announce(refs_a[2])
    out_a.finish(3)
    assert watcher.poll() == [(a, refs_a[2])]
    assert a.finished and not b.finished and a.written == 10 + 11 + 12


def test_poll_reads_whole_records_only(server, run_dir):
    """A request cut short (a task killed mid-send) is refused whole: nothing of it is read."""
    watcher = StreamWatcher(run_dir, server)
    task, out = watched(watcher, 1, "k")
    ref = task_block(run_dir, 1, "k", 0)
    body = json.dumps({"stream": out.name, "record": {"block": block_record(ref)}, "token": server.token}).encode()
    with pytest.raises(flight.FlightServerError, match="malformed request"):
        list(flight.FlightClient(server.uri).do_action(flight.Action("stream", body[:-20])))
    assert watcher.poll() == [] and task.written == 0
    list(flight.FlightClient(server.uri).do_action(flight.Action("stream", body)))
    assert watcher.poll() == [(task, ref)]


def test_a_lost_block_file_is_still_the_right_block(server, run_dir):
    """Announced, then lost (an executor's disk): lineage rebuilds it at the same path."""
    watcher = StreamWatcher(run_dir, server)
    task, out = watched(watcher, 1, "k")
    ref = task_block(run_dir, 1, "k", 0, write=False)
    out.announce(ref)
    assert watcher.poll() == [(task, ref)]


def test_wait_records_make_a_task_waiting_until_granted(server, run_dir):
    watcher = StreamWatcher(run_dir, server)
    up, out_up = watched(watcher, 0, "u", granted=1)
    down, out_down = watched(watcher, 3, "d", granted=0)
    mid, _ = watched(watcher, 1, "m", granted=0)
    out_up.announce(task_block(run_dir, 0, "u", 0))
    assert send(out_up, {"wait": 1}) == {"grant": 1}  # what OutputStream.wait_for(1) sends before it blocks
    assert send(out_down, {"wait": 0}) == {"grant": 0}
    watcher.poll()
    assert (up.waiting_for, down.waiting_for, mid.waiting_for) == (1, 0, None)
    assert watcher.waiting() == [down, up]  # most downstream first
    watcher.grant(up, 2)
    assert watcher.waiting() == [down]
    out_up.wait_for(1)  # the task side reads the grant and goes on
    assert out_up.granted == 2
    down.yielding = True
    assert watcher.waiting() == []


def test_held_back_follows_tasks_queued_behind_a_waiting_one(server, run_dir):
    watcher = StreamWatcher(run_dir, server)
    first, _ = watched(watcher, 1, "a", granted=0)
    second, _ = watched(watcher, 1, "b")
    third, _ = watched(watcher, 1, "c")
    other, _ = watched(watcher, 1, "d")
    second.after, third.after = first.stream, second.stream
    first.waiting_for = 0
    assert {t.name for t in watcher.held_back(watcher.waiting())} == {first.name, second.name, third.name}
    second.finished = True  # wrote all it had: it holds nothing back, nor anything behind it
    assert {t.name for t in watcher.held_back(watcher.waiting())} == {first.name}
    assert other.name not in {t.name for t in watcher.held_back(watcher.waiting())}


def test_forget_closes_the_stream(server, run_dir):
    watcher = StreamWatcher(run_dir, server)
    task, out = watched(watcher, 1, "k")
    out.finish(0)
    watcher.grant(task, 3)
    assert watcher.forget(task.name) is task
    assert task.name not in watcher.tasks and server.take_records(task.name) == []
    with pytest.raises(RuntimeError, match="no longer runs"):  # a late record of the ended attempt stops it
        out.announce(task_block(run_dir, 1, "k", 0))
    with pytest.raises(RuntimeError, match="no longer runs"):
        out.wait_for(200)
    assert server.take_records(task.name) == []  # and is kept nowhere


@pytest.mark.parametrize("lie", [
    "block id of another index",
    "block id of another operator",
    "a slice of the file",
    "negative size",
    "rows not an integer",
    "index not an integer",
    "negative index",
    "path of another operator",
    "a missing field",
    "an unknown field",
    "location not a string",
])
def test_records_that_lie_about_the_block_are_forged(server, run_dir, lie):
    watcher = StreamWatcher(run_dir, server)
    task, out = watched(watcher, 1, "k")
    good = task_block(run_dir, 1, "k", 0)
    record = block_record(good)
    if lie == "block id of another index":
        record["block_id"] = "1:k:1"
    elif lie == "block id of another operator":
        record["block_id"] = "2:k:0"
    elif lie == "a slice of the file":
        record["length"] = 1
    elif lie == "negative size":
        record["size_bytes"] = -5
    elif lie == "rows not an integer":
        record["num_rows"] = "2"
    elif lie == "index not an integer":
        record["producer"] = ["Op1", "k", "0"]
    elif lie == "negative index":
        record["producer"] = ["Op1", "k", -1]
        record["block_id"] = "1:k:-1"
        record["path"] = os.path.join(run_dir, "1-k--1.arrow")
    elif lie == "path of another operator":
        record["path"] = task_block(run_dir, 2, "k", 0).path
    elif lie == "a missing field":
        del record["size_bytes"]
    elif lie == "an unknown field":
        record["delete_after"] = "/etc/passwd"
    elif lie == "location not a string":
        record["location"] = ["grpc+tcp://127.0.0.1:1"]
    send(out, {"block": record})
    with pytest.raises(ForgedStreamRecordError, match="task k of operator 1 announced a block"):
        watcher.poll()
    assert os.path.exists(good.path)  # nothing named was touched


def test_the_right_record_after_the_check_passes(server, run_dir):
    """The control for the forgeries above: the same record, unchanged, is accepted."""
    watcher = StreamWatcher(run_dir, server)
    task, out = watched(watcher, 1, "k")
    good = task_block(run_dir, 1, "k", 0)
    out.announce(good)
    assert watcher.poll() == [(task, good)]


@pytest.mark.parametrize("token", ["not-the-secret", ""])
def test_a_record_without_the_run_secret_is_refused(server, run_dir, token):
    """Holders of the run's secret are the only ones heard: the record is refused before it is kept."""
    watcher = StreamWatcher(run_dir, server)
    task, out = watched(watcher, 1, "k")
    good = task_block(run_dir, 1, "k", 0)
    stranger = ControlInfo(server.uri, token, server.driver_id, timeout_s=5)
    with pytest.raises(flight.FlightUnauthenticatedError):
        call(stranger, "stream", {"stream": task.name, "record": {"block": block_record(good)}})
    with pytest.raises(flight.FlightUnauthenticatedError):
        call(stranger, "grant", {"stream": task.name, "index": 0, "wait_s": 0})
    no_token = json.dumps({"stream": task.name, "record": {"done": 1}}).encode()
    with pytest.raises(flight.FlightUnauthenticatedError):
        list(flight.FlightClient(server.uri).do_action(flight.Action("stream", no_token)))
    assert watcher.poll() == [] and not task.finished and task.written == 0
    out.announce(good)  # the task itself is still heard
    assert watcher.poll() == [(task, good)]
