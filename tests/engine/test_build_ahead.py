"""Models load while the input is read (`DataContext.build_ahead`, issue 28 item 3).

The pipeline is a read whose tasks take a while, then a class whose constructor takes a
while (a model loading): with a ``concurrency`` cap (an operator of its own), or without
(fused into the read's tasks). Every construction and every batch logs its process,
thread and time. With build-ahead, the read's tasks start building the instances in a
thread of their Python worker: the constructor runs in that thread and begins while
reads still run, and a cap holds. Without it, the operator's own tasks
build them on their main thread once the reads have produced blocks.

Only a cap of at least the task slots is built ahead (`launcher._built_ahead`): with
fewer, Spark may hand the operator's task to a worker without an instance, which has
another released and builds its own.
"""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from conftest import SPARK_SLOTS

import airflow_streambatch.engine as rd

BLOCKS = 8
BUILD_S = 1.5
CAP = SPARK_SLOTS  # a smaller cap is not built ahead


def slow_read(batch):
    """The read's work: long enough that builds started by its first tasks end before its last."""
    time.sleep(0.4)
    return batch


class SlowModel:
    """Logs ``new`` (start and end of construction) and ``call`` lines; fails to build if asked."""

    def __init__(self, log_path: str, fail: bool = False):
        self.log_path = log_path
        start = time.time()
        if fail:
            raise ValueError("the model's weights are missing")
        time.sleep(BUILD_S)
        self._log("new", start)

    def __call__(self, batch):
        self._log("call", time.time())
        return batch

    def _log(self, event: str, at: float) -> None:
        with open(self.log_path, "a") as f:
            f.write(f"{event} {os.getpid()} {threading.current_thread().name} {at:.6f} {time.time():.6f}\n")


def slow_read_logged(log_path: str):
    def read(batch):
        batch = slow_read(batch)
        with open(log_path, "a") as f:
            f.write(f"read {os.getpid()} {threading.current_thread().name} 0 {time.time():.6f}\n")
        return batch
    return read


def _run(ctx, tmp_path, *, fail: bool = False, cap: int | None = CAP):
    log_path = str(tmp_path / "events.log")
    ds = (rd.range(BLOCKS * 10, override_num_blocks=BLOCKS).map_batches(slow_read_logged(log_path))
          .map_batches(SlowModel, fn_constructor_args=(log_path, fail), concurrency=cap))
    rows = sorted(row["id"] for row in ds.take_all())
    with open(log_path) as f:
        events = [line.split() for line in f]
    return rows, events, ds


@pytest.mark.parametrize("cap", [CAP, None], ids=["capped, an operator of its own", "uncapped, fused with the read"])
def test_the_reads_tasks_build_the_models_while_the_input_is_read(ctx, tmp_path, cap):
    ctx.build_ahead = True
    rows, events, ds = _run(ctx, tmp_path, cap=cap)
    assert rows == list(range(BLOCKS * 10))
    builds = [e for e in events if e[0] == "new"]
    reads_end = max(float(e[4]) for e in events if e[0] == "read")
    ahead = [e for e in builds if e[2] == "streambatch-build-ahead"]
    if cap is None:  # every worker that runs the fused operator builds its own, as its partition starts
        assert ahead == builds, builds
        assert [n for n in ds.last_run_stats.ops if "SlowModel" in n.name][0].name.startswith("ReadRange->")
    assert 1 <= len(ahead) <= CAP, builds
    assert min(float(start) for *_, start, _ in ahead) < reads_end, "no build began while the reads ran"
    first_call = min(float(e[3]) for e in events if e[0] == "call")
    assert any(e[1] == pid and float(e[3]) < first_call + 0.5 for e in events if e[0] == "call"
               for _, pid, *_ in ahead), "no instance built ahead served the first batches"
    assert re.search(r"model cop(y|ies) built in [0-9.]+ s \([0-9.]+ s of it ahead of their tasks\)",
                     ds.last_run_stats.summary())  # counted in the first task that uses each


@pytest.mark.parametrize("why", ["build_ahead=False", "a cap below the slots"])
def test_otherwise_the_operators_own_tasks_build_them(ctx, tmp_path, why):
    ctx.build_ahead = why != "build_ahead=False"  # False is the default
    rows, events, _ = _run(ctx, tmp_path, cap=CAP if why == "build_ahead=False" else CAP - 1)
    assert rows == list(range(BLOCKS * 10))
    builds = [e for e in events if e[0] == "new"]
    assert builds and all(thread == "MainThread" for _, _, thread, _, _ in builds), builds


@pytest.mark.parametrize("cap", [CAP, None], ids=["capped", "uncapped"])
def test_a_build_ahead_that_fails_fails_the_run_with_the_users_error(ctx, tmp_path, cap):
    ctx.build_ahead = True
    with pytest.raises(Exception, match="the model's weights are missing"):
        _run(ctx, tmp_path, fail=True, cap=cap)
