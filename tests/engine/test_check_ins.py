"""Task pulling: Spark partitions that ran their tasks check in with the driver for more
(`execution/check_ins.py`). The desk on its own, then runs on real Spark."""

from __future__ import annotations

import base64
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq

import airflow_streambatch.engine as sb
from airflow_streambatch.engine.execution import check_ins
from airflow_streambatch.engine.execution.check_ins import CheckInDesk


def _body(seq: int, results: list[bytes] = (), run: str = "r1") -> dict:
    return {"run": run, "launch": 3, "part": 1, "seq": seq,
            "results": [base64.b64encode(r).decode() for r in results]}


def _answering(desk: CheckInDesk, specs: list[bytes], payload: bytes | None = None) -> list:
    """Open run r1 with a loop that answers every check-in at once; returns what it received."""
    received = []

    def deliver(check_in):
        received.append(check_in)
        check_in.answer(specs, payload)

    desk.open("r1", deliver)
    return received


def test_a_check_in_reaches_its_run_and_carries_the_answer_back():
    desk = CheckInDesk()
    received = _answering(desk, [b"spec-a", b"spec-b"], payload=b"other-op")
    reply = desk.check_in(_body(0, [b"result"]))
    assert [c.results for c in received] == [[b"result"]]
    assert (received[0].launch_id, received[0].part) == (3, 1)
    assert [base64.b64decode(s) for s in reply["specs"]] == [b"spec-a", b"spec-b"]
    assert base64.b64decode(reply["op"]) == b"other-op"


def test_a_repeated_call_gets_the_same_answer_and_is_not_delivered_twice():
    """A call whose answer was lost is sent again with its number: its results must not be
    taken twice, nor its tasks handed out twice."""
    desk = CheckInDesk()
    received = _answering(desk, [b"spec"])
    first = desk.check_in(_body(0, [b"result"]))
    again = desk.check_in(_body(0, [b"result"]))
    assert first == again and len(received) == 1
    desk.check_in(_body(1, [b"next"]))
    assert len(received) == 2
    assert desk.check_in(_body(0, [b"result"])) == {"specs": []}  # older than the last: answered already


def test_an_unanswered_check_in_ends_its_partition_and_refuses_a_late_answer(monkeypatch):
    """A loop that does not answer in time (rebuilding a block by lineage, which needs a Spark
    slot) must not keep partitions holding every slot: the partition ends, and tasks the loop
    hands out afterwards are known not to run."""
    monkeypatch.setattr(check_ins, "CHECK_IN_WAIT_S", 0.05)
    desk = CheckInDesk()
    received = []
    desk.open("r1", received.append)
    start = time.monotonic()
    assert desk.check_in(_body(0, [b"result"])) == {"specs": []}
    assert time.monotonic() - start < 1.0
    assert received[0].answer([b"late"]) is False


def test_a_closed_run_sends_partitions_away():
    desk = CheckInDesk()
    _answering(desk, [b"spec"])
    desk.close("r1")
    assert desk.check_in(_body(0)) == {"specs": []}


def test_one_call_waiting_while_its_repeat_arrives_gets_one_answer():
    desk = CheckInDesk()
    received = []
    desk.open("r1", received.append)
    replies = []
    callers = [threading.Thread(target=lambda: replies.append(desk.check_in(_body(0, [b"r"])))) for _ in range(2)]
    for caller in callers:
        caller.start()
        time.sleep(0.1)
    received[0].answer([b"spec"])
    for caller in callers:
        caller.join(5)
    assert len(received) == 1 and len(replies) == 2 and replies[0] == replies[1]


# -- on Spark -------------------------------------------------------------------------------


def _stage(batch):
    time.sleep(0.005)
    return pa.table({"id": batch["id"], "stage": pa.array([1] * batch.num_rows)})


def _stage_two(batch):
    time.sleep(0.005)
    return batch.select(["id"])


def _two_stages(n: int):
    return (sb.range(n, override_num_blocks=n).map_batches(_stage, batch_format="pyarrow")
            .map_batches(_stage_two, batch_format="pyarrow"))


def test_partitions_pull_tasks_of_every_operator_in_few_spark_jobs(ctx):
    """One-row blocks through three operators: a job per task group paid ~100 ms of Spark
    per job; partitions that check in run the whole pipeline in a handful of jobs."""
    ctx.enable_operator_fusion = False
    ds = _two_stages(96)
    assert sorted(row["id"] for row in ds.take_all()) == list(range(96))
    stats = ds.last_run_stats
    tasks = sum(op.tasks_done for op in stats.ops)
    assert len(stats.launch_log) * 10 <= tasks, stats.launch_log


class _Model:
    """A stateful UDF with a concurrency cap: the cap is the scheduler's, Spark places its tasks as any CPU task's."""

    def __call__(self, batch):
        time.sleep(0.02)
        return batch


def test_a_capped_model_and_its_writer_share_partitions(ctx, tmp_path):
    """A model with ``concurrency=2`` and the writer after it ask Spark for the same CPU slot:
    a partition that ran a model task takes the writer's next task when it checks in (and
    back), instead of ending so that a job of the writer's own is launched for each block
    (two Spark jobs per block before: ~200 ms of overhead per task on 2 cores)."""
    ctx.enable_operator_fusion = False
    ds = sb.range(48, override_num_blocks=24).map_batches(_Model, concurrency=2, batch_format="pyarrow")
    ds.write_parquet(str(tmp_path / "out"))
    stats = ds.last_run_stats
    assert [op.tasks_done for op in stats.ops][1:] == [24, 24]
    assert len(stats.launch_log) * 4 <= 48, stats.launch_log
    assert sorted(pq.read_table(str(tmp_path / "out"))["id"].to_pylist()) == list(range(48))


def test_without_group_scheduling_each_job_runs_its_group_and_ends(ctx):
    ctx.enable_operator_fusion = False
    ctx.group_scheduling = False
    ds = _two_stages(12)
    assert sorted(row["id"] for row in ds.take_all()) == list(range(12))
    stats = ds.last_run_stats
    # every task launched by a job of its own partition, none handed to a partition that checked in
    # (a job may hold several partitions when several slots were free at once)
    assert sum(tasks for _, tasks, _ in stats.launch_log) == sum(op.tasks_done for op in stats.ops)
    assert all(tasks == partitions for _, tasks, partitions in stats.launch_log), stats.launch_log


def test_partitions_that_stop_waiting_lose_no_task_and_run_none_twice(ctx, monkeypatch):
    """Every check-in abandoned at once: each task the loop hands out afterwards is taken back
    and run in a later job, so every row arrives exactly once."""
    monkeypatch.setattr(check_ins, "CHECK_IN_WAIT_S", 0.0)
    ctx.enable_operator_fusion = False
    ds = _two_stages(24)
    assert sorted(row["id"] for row in ds.take_all()) == list(range(24))
