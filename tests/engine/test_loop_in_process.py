"""The scheduler loop on a backend in this process (`inprocess_backend.py`): slots and
concurrency caps, memory limits, retries, failed partitions, lineage and timeouts, each
in well under a second. The Spark tests (`test_scheduler.py`, `test_fault_tolerance.py`,
`test_memory_budget.py`) prove the same on the real thing; these find a broken loop fast."""

from __future__ import annotations

import os
import threading
import time
from functools import partial

import pyarrow as pa
import pytest

import airflow_streambatch.engine as sb
from airflow_streambatch.engine import DataContext
from airflow_streambatch.engine.execution.lineage import base_id
from cluster_job import first_time
from inprocess_backend import run_in_process

MiB = 1 << 20
_lock = threading.Lock()
_calls: dict[str, int] = {}


@pytest.fixture
def ctx(tmp_path):
    _calls.clear()
    context = DataContext(block_dir=str(tmp_path / "blocks"), progress_interval_s=0)
    with context.scoped():
        yield context


def _count(name: str, by: int = 1) -> int:
    with _lock:
        _calls[name] = _calls.get(name, 0) + by
        return _calls[name]


def _double(batch):
    return {"id": batch["id"] * 2}


def _one_model(batch):  # records how many run at once
    _calls["most"] = max(_calls.get("most", 0), _count("running"))
    time.sleep(0.005)
    _count("running", -1)
    return batch


def test_every_row_arrives_and_a_concurrency_cap_holds(ctx):
    ds = sb.range(400, override_num_blocks=20).map_batches(_double).map_batches(_one_model, concurrency=1)
    rows, executor = run_in_process(ds)
    assert sorted(r["id"] for r in rows) == [2 * i for i in range(400)]
    assert _calls["most"] == 1
    tasks = [op.tasks_done for op in executor.stats.ops]
    assert tasks[0] == 20 and tasks[1] >= 1  # the model's tasks take small blocks together
    jobs = executor.parts.backend.jobs
    assert len(jobs) < sum(tasks), f"partitions that check in run more tasks in the same job: {jobs}"


def _expand(row):  # a 4 MiB source partition per input row
    return [{"id": row["id"], "payload": bytes(MiB)} for _ in range(4)]


def _shrink(batch):
    return pa.table({"id": batch["id"]})


def test_sixty_four_mib_stream_through_a_ten_mib_limit(ctx):
    ctx.scheduling_policy = "conservative"  # the policy that promises it (`test_scheduler.py`)
    ctx.memory_limit = 10 * MiB
    ctx.target_max_block_size = 2 * MiB
    ds = sb.range(16, override_num_blocks=16).flat_map(_expand).map_batches(_shrink, num_cpus=0.5,
                                                                            batch_format="pyarrow")
    rows, executor = run_in_process(ds)
    assert len(rows) == 64
    assert executor.stats.ops[0].bytes_out >= 64 * MiB
    assert 0 < executor.stats.peak_memory_bytes <= 10 * MiB + 4096


def _fails_once_on_seven(batch):
    if 7 in batch["id"] and _count("seven") == 1:
        raise ValueError("a flaky model call")
    return batch


def test_first_tasks_of_a_source_share_one_job_on_the_adaptive_policy(ctx):
    """Under the default policy a source's first tasks (sizes unknown) start together, one Spark
    partition per slot in one job; grants bound what they write. (Each ran alone in a job of its
    own: the demo's 4 tasks took 4 jobs on 2 slots.) The conservative policy still probes alone."""
    for policy, first_launch in (("adaptive", 2), ("conservative", 1)):
        ctx.scheduling_policy = policy
        rows, executor = run_in_process(sb.range(4, override_num_blocks=4).map_batches(_one_model))
        assert sorted(r["id"] for r in rows) == [0, 1, 2, 3]
        assert executor.parts.launcher.launch_log[0] == (0, first_launch, first_launch), policy


def test_a_task_that_raised_is_run_again(ctx):
    rows, executor = run_in_process(sb.range(40, override_num_blocks=8).map_batches(_fails_once_on_seven))
    assert sorted(r["id"] for r in rows) == list(range(40))
    assert _calls["seven"] == 2
    assert sum(op.tasks_retried for op in executor.stats.ops) == 1


def _always_fails_on_seven(batch):
    if 7 in batch["id"]:
        raise ValueError("row 7 is bad")
    return batch


def test_a_partition_that_keeps_failing_is_set_apart_within_max_failed_partitions(ctx):
    ctx.max_failed_partitions = 1
    ds = sb.range(40, override_num_blocks=8).map_batches(_always_fails_on_seven)
    rows, executor = run_in_process(ds)
    assert sorted(r["id"] for r in rows) == [i for i in range(40) if not 5 <= i < 10]
    (failure,) = executor.stats.failed_partitions
    assert failure.partition == 1 and "row 7 is bad" in failure.error


def test_a_partition_past_max_failed_partitions_fails_the_run_naming_it(ctx):
    executors = []
    with pytest.raises(Exception, match=r"(?s)partition 1.*row 7 is bad"):
        run_in_process(sb.range(40, override_num_blocks=8).map_batches(_always_fails_on_seven),
                       started=executors.append)
    run_id = executors[0].run_id  # the failed run's task streams are closed (they held the control plane busy)
    assert not [name for name in executors[0].control._streams if name.endswith(f"@{run_id}")]


def test_a_lost_output_block_is_rebuilt_by_lineage(ctx):
    lost, executors = [], []

    def lose_the_first(ref):
        if not lost:
            deadline = time.monotonic() + 10  # a streamed block's task may still run: lineage knows it once it ended
            while base_id(ref) not in executors[0].lineage.records and time.monotonic() < deadline:
                time.sleep(0.005)
            lost.append(ref.block_id)
            os.remove(ref.path)

    rows, executor = run_in_process(sb.range(40, override_num_blocks=4).map_batches(_double),
                                    before_read=lose_the_first, started=executors.append)
    assert sorted(r["id"] for r in rows) == [2 * i for i in range(40)]
    assert lost and executor.parts.backend.replays == 1


def _hangs_on_zero(batch):
    if 0 in batch["id"]:
        time.sleep(1.0)
    return batch


def test_a_task_past_task_timeout_fails_naming_the_setting(ctx):
    ctx.group_scheduling = False  # results travel with the job: a cancelled job's partitions deliver none
    ctx.task_timeout_s = 0.2
    ctx.max_task_retries = 0
    with pytest.raises(Exception, match=r"DataContext.task_timeout_s=0.2"):
        run_in_process(sb.range(8, override_num_blocks=4).map_batches(_hangs_on_zero))


def _crash_first_then_slow(batch, markers):
    if batch["id"][0] == 0 and first_time(markers, "crashed"):
        raise SystemExit("the Python worker died")  # not a task error: the whole partition ends, as a crash does
    if batch["id"][0] != 0:
        time.sleep(0.5)  # still running when the job is reported failed
    return batch


def test_a_partition_that_checks_in_after_its_job_failed_is_told_to_stop_and_its_tasks_rerun(ctx, tmp_path):
    """Spark reports a job failed at its first failed task while its other partitions run on;
    their check-ins then name a launch the loop has finished (it took their tasks back)."""
    markers = tmp_path / "markers"
    markers.mkdir()
    rows, executor = run_in_process(
        sb.range(4, override_num_blocks=2).map_batches(partial(_crash_first_then_slow, markers=str(markers))))
    assert sorted(r["id"] for r in rows) == [0, 1, 2, 3]  # each row once
