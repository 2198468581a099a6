"""``map_batches(Cls, concurrency=n)`` keeps at most ``n`` live instances of ``Cls`` (issue 17, item 9).

Ray's ``concurrency=n`` for a class is an actor pool of ``n`` actors. Spark keeps several
Python workers and hands each task to whichever is idle, so without a bound each worker
that ran the operator would keep its own instance (a model each). Every instance here logs
its birth and its death (``__del__``) with the time; the log must never show more than
``n`` alive at once, and every row must come out exactly once.

The shape matters: a first step that runs four tasks at once makes Spark start four Python
workers, and the capped step's tasks then land on any of them (checked: several pids
build instances). Without the driver's slots, up to four instances stay alive.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

import airflow_streambatch.engine as rd

BLOCKS = 32
RELEASE_BOUND_S = 15.0  # after a run, its instances are deleted within this


def spread(batch):
    """Four tasks at once: Spark starts a Python worker for each."""
    time.sleep(0.05)
    return batch


class Logged:
    """Appends ``pid name event time`` on construction and deletion; fails once if asked."""

    def __init__(self, log_path: str, fail_marker: str = ""):
        self.log_path = log_path
        self.fail_marker = fail_marker
        self.name = uuid.uuid4().hex[:8]
        self._log("new")

    def __call__(self, batch):
        if self.fail_marker and 7 in batch["id"] and not os.path.exists(self.fail_marker):
            open(self.fail_marker, "w").close()
            raise RuntimeError("the first attempt of the task holding row 7 fails")
        time.sleep(0.01)
        return batch

    def __del__(self):
        self._log("del")

    def _log(self, event: str) -> None:
        with open(self.log_path, "a") as f:
            f.write(f"{os.getpid()} {self.name} {event} {time.time():.6f}\n")


def _events(log_path: str) -> list[tuple[float, int, str, str]]:
    """(time, +1 born / -1 deleted, name, pid), in time order, deaths first at equal times."""
    out = []
    with open(log_path) as f:
        for line in f:
            pid, name, event, at = line.split()
            out.append((float(at), 1 if event == "new" else -1, name, pid))
    return sorted(out, key=lambda e: (e[0], e[1]))


def most_alive_at_once(log_path: str) -> int:
    alive = most = 0
    for _, step, _, _ in _events(log_path):
        alive += step
        most = max(most, alive)
    return most


def _run(log_path: str, n: int, fail_marker: str = "") -> list[int]:
    ds = (rd.range(BLOCKS, override_num_blocks=BLOCKS).map_batches(spread)
          .map_batches(Logged, fn_constructor_args=(log_path, fail_marker), concurrency=n))
    return sorted(row["id"] for row in ds.take_all())


def _assert_all_released(log_path: str) -> None:
    """The run ended: the driver told every holder, and each deleted its instance."""
    deadline = time.monotonic() + RELEASE_BOUND_S
    while True:
        events = _events(log_path)
        born = {name for _, step, name, _ in events if step > 0}
        dead = {name for _, step, name, _ in events if step < 0}
        if born == dead:
            return
        assert time.monotonic() < deadline, f"instances {born - dead} still alive {RELEASE_BOUND_S:.0f} s after the run"
        time.sleep(0.2)


@pytest.mark.parametrize("n", [1, 2])
def test_at_most_n_instances_are_alive_at_once_across_python_workers(ctx, tmp_path, n):
    # Partitions that check in for more tasks keep a capped operator in the Python workers that
    # hold its instances (what a user wants); one job per task group spreads it over many, which
    # is the case the bound must hold in.
    ctx.group_scheduling = False
    log_path = str(tmp_path / "instances.log")
    assert _run(log_path, n) == list(range(BLOCKS))
    assert most_alive_at_once(log_path) <= n, open(log_path).read()  # one not yet deleted counts as alive
    _assert_all_released(log_path)
    pids = {pid for _, _, _, pid in _events(log_path)}
    assert len(pids) >= 2, "the shape must make several Python workers run the capped step"


def test_a_retried_task_still_respects_the_bound(ctx, tmp_path):
    log_path, marker = str(tmp_path / "instances.log"), str(tmp_path / "failed-once")
    assert _run(log_path, 1, fail_marker=marker) == list(range(BLOCKS))
    assert os.path.exists(marker), "the task holding row 7 never failed: nothing was retried"
    assert most_alive_at_once(log_path) <= 1, open(log_path).read()
    _assert_all_released(log_path)


def test_instances_do_not_outlive_their_run(ctx, tmp_path):
    """Instances belong to a run: once it ends they are deleted, and the next run of the same
    dataset builds its own."""
    log_path = str(tmp_path / "instances.log")
    ds = rd.range(4, override_num_blocks=2).map_batches(Logged, fn_constructor_args=(log_path,), concurrency=1)
    assert ds.count() == 4
    _assert_all_released(log_path)
    first = {name for _, step, name, _ in _events(log_path) if step > 0}
    assert ds.count() == 4
    _assert_all_released(log_path)
    assert {name for _, step, name, _ in _events(log_path) if step > 0} - first


# -- the control plane alone (no Spark): expiry, the bound wait's error, calls per task ------------
class Model:
    deleted = 0

    def __del__(self):
        Model.deleted += 1


def _transform(uid: str):
    from types import SimpleNamespace

    return SimpleNamespace(name="MapBatches(Model)", fn=Model, fn_constructor_args=(), fn_constructor_kwargs={},
                           compute=SimpleNamespace(concurrency=1), uid=uid)


@pytest.fixture()
def server():
    from airflow_streambatch.engine.execution.control_server import ControlServer

    s = ControlServer("127.0.0.1")
    yield s
    s.shutdown()


def test_a_dead_holders_slot_expires_and_a_waiter_gets_it():
    from airflow_streambatch.engine.execution.instance_slots import InstanceSlots

    slots, body = InstanceSlots(), {"run": "r", "op": "o", "cap": 1, "ttl_s": 0.5}
    assert slots.acquire({**body, "holder": "died", "wait_s": 0})["granted"]
    assert not slots.acquire({**body, "holder": "next", "wait_s": 0.1})["granted"]  # it is still counted
    started = time.monotonic()
    assert slots.acquire({**body, "holder": "next", "wait_s": 3})["granted"]  # "died" never polls again
    assert 0.2 < time.monotonic() - started < 3
    assert slots.live("r", "o") == 1


def test_a_slot_that_never_frees_fails_the_task_naming_the_setting(server):
    from airflow_streambatch.engine.worker import udf
    from airflow_streambatch.engine.worker.instance_lease import InstanceSlotTimeout

    server.instances.acquire({"run": "r", "op": "busy-op", "holder": "busy elsewhere", "cap": 1, "ttl_s": 60})
    env = udf.TaskEnv(run_id="r", control=server.info(timeout_s=1.5))
    with pytest.raises(InstanceSlotTimeout, match=r"MapBatches\(Model\).*concurrency=1.*DataContext.control_timeout_s"):
        udf._udf(_transform("busy-op"), env)
    assert server.instances.live("r", "busy-op") == 1  # the waiter took nothing


def test_a_held_instance_costs_no_call_and_goes_when_its_run_ends(server, monkeypatch):
    from airflow_streambatch.engine.worker import instance_lease, udf

    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")  # as in a Spark Python worker
    acquired = []
    acquire = server.instances.acquire
    monkeypatch.setattr(server.instances, "acquire", lambda body: acquired.append(body) or acquire(body))
    transform, deleted = _transform("held-op"), Model.deleted
    instances = []
    for task in range(3):
        env = udf.TaskEnv(run_id="run-1", task_key=str(task), control=server.info(timeout_s=10))
        instances.append(udf._udf(transform, env))
        env.end_task()
    assert len(acquired) == 1 and instances[0] is instances[1] is instances[2]
    del instances
    server.end_instances("run-1")
    deadline = time.monotonic() + 7
    while (len(instance_lease._leases) or server.instances.live("run-1", "held-op")) and time.monotonic() < deadline:
        time.sleep(0.05)  # deleted here, then the driver is told
    assert len(instance_lease._leases) == 0 and Model.deleted == deleted + 1
    assert server.instances.live("run-1", "held-op") == 0


class SlowToBuild:
    def __init__(self):
        time.sleep(3.0)  # longer than the slot's expiry (half of control_timeout_s=4)


def test_a_constructor_slower_than_the_expiry_keeps_its_slot(server, monkeypatch):
    from airflow_streambatch.engine.worker import udf

    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    transform = _transform("slow-op")
    transform.fn = SlowToBuild
    env = udf.TaskEnv(run_id="run-slow", control=server.info(timeout_s=4))
    udf._udf(transform, env)
    other = {"run": "run-slow", "op": "slow-op", "holder": "other", "cap": 1, "ttl_s": 60, "wait_s": 0}
    assert not server.instances.acquire(other)["granted"]  # the builder polled while it built: still live
    env.end_task()
    server.end_instances("run-slow")
