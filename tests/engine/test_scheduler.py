"""Scheduling: memory limits, slots and GPU ids, concurrency, and Algorithm 2's arithmetic."""

from __future__ import annotations

import os
import time

import pyarrow as pa

import airflow_streambatch.engine as sb
from airflow_streambatch.engine.execution.estimates import Estimates
from airflow_streambatch.engine.execution.memory import MemoryBudget
from airflow_streambatch.engine.execution.policies import AdaptivePolicy

MiB = 1 << 20


def _expand(row):  # a 4 MiB source partition per input row
    return [{"id": row["id"], "payload": bytes(MiB)} for _ in range(4)]


def _slow_shrink(batch):
    time.sleep(0.2)
    return pa.table({"id": batch["id"]})


def test_conservative_policy_never_exceeds_the_memory_limit(ctx):
    ctx.scheduling_policy = "conservative"
    ctx.memory_limit = 10 * MiB
    ctx.target_max_block_size = 2 * MiB
    ds = sb.range(16, override_num_blocks=16).flat_map(_expand).map_batches(_slow_shrink, num_cpus=0.5,
                                                                            batch_format="pyarrow")
    assert ds.count() == 64
    stats = ds.last_run_stats
    assert 0 < stats.peak_memory_bytes <= 10 * MiB
    assert stats.ops[0].bytes_out >= 64 * MiB  # six times the limit streamed through


def _expand_after_a_while(batch):  # 8 bytes in, four 2 MiB blocks out, once every task has started
    time.sleep(1.0)
    for _ in range(4):
        yield {"id": list(batch["id"]) * 2, "payload": [bytes(MiB)] * 2}


def test_tasks_started_before_their_operators_first_block_ask_for_memory(ctx):
    """Before any block of an operator existed, its tasks were granted blocks by their input's
    size: four tasks of 8 bytes then wrote 2 MiB blocks without asking, to 11 MiB under a
    6 MiB limit (W8 found adaptive runs at 3x their limit)."""
    ctx.memory_limit = 6 * MiB
    ctx.target_max_block_size = 2 * MiB
    ds = (sb.range(8, override_num_blocks=8).map_batches(_expand_after_a_while, num_cpus=0.5)  # not fused
          .map_batches(_slow_shrink, num_cpus=0.25, batch_format="pyarrow"))
    assert ds.count() == 64
    assert 0 < ds.last_run_stats.peak_memory_bytes <= 6 * MiB + 4096


def test_one_cpu_slot_does_not_hang_before_a_repartition(ctx):
    """A repartition waiting for the rest of its input once kept the only CPU slot from the
    source that had to produce it: the run waited forever, and nothing said why (W8)."""
    import threading

    ctx.resources = {"CPU": 1}
    ds = sb.range(8, override_num_blocks=4).map_batches(_slow_shrink, batch_format="pyarrow").repartition(2)
    counted: list[int] = []
    runner = threading.Thread(target=lambda: counted.append(ds.count()), daemon=True)
    runner.start()
    runner.join(120)
    assert counted == [8], "the run did not finish within 120 s"


def _quarter_mib_rows(batch):  # two rows of 256 KiB per input row
    rows = 2 * batch.num_rows
    return pa.table({"id": list(range(rows)), "payload": [bytes(256 * 1024)] * rows})


def test_blocks_are_granted_by_their_size_under_a_tight_limit(ctx, caplog):
    """A repartition holding 2.5 MiB under a 4 MiB limit. Each task waiting to write a block
    was granted a full 2 MiB block: the repartition's 768 KiB blocks and its consumer's
    8-byte ones waited until the stall guard wrote past the limit (W8 #9). A task now says
    the size of the block it waits to write and is granted that, and each input block of
    the barrier goes as soon as the tasks slicing it are done."""
    ctx.scheduling_policy = "conservative"
    ctx.memory_limit = 4 * MiB
    ctx.target_max_block_size = 2 * MiB
    ds = (sb.range(5, override_num_blocks=5).map_batches(_quarter_mib_rows, batch_format="pyarrow")
          .repartition(4).map_batches(_slow_shrink, num_cpus=0.5, batch_format="pyarrow"))
    with caplog.at_level("WARNING", logger="airflow_streambatch"):
        assert ds.count() == 10
    assert not [r for r in caplog.records if "over the limit" in r.getMessage()]
    assert 2.5 * MiB <= ds.last_run_stats.peak_memory_bytes <= 4 * MiB


def test_adaptive_policy_finishes_under_pressure_and_pipelines(ctx):
    ctx.memory_limit = 10 * MiB
    ctx.target_max_block_size = 2 * MiB
    ds = sb.range(16, override_num_blocks=16).flat_map(_expand).map_batches(_slow_shrink, num_cpus=0.5,
                                                                            batch_format="pyarrow")
    assert ds.count() == 64
    # Adaptive may overshoot while its estimates are young (paper 4.3.2), but it streams:
    # it never holds anything near the 64 MiB the sources produce in all.
    assert ds.last_run_stats.peak_memory_bytes <= 32 * MiB


class _Recorder:
    """Writes (pid, gpu ids, start, end) per batch so the test can check overlap."""

    def __init__(self, out_dir):
        self.out_dir = out_dir

    def __call__(self, batch):
        start = time.time()
        time.sleep(0.3)
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "") or f"none-{os.getpid()}-{start}"
        with open(os.path.join(self.out_dir, f"{os.getpid()}-{start}"), "w") as f:
            f.write(f"{gpus} {start} {time.time()}")
        return batch


def _max_overlap(out_dir):
    spans = []
    for name in os.listdir(out_dir):
        gpus, start, end = open(os.path.join(out_dir, name)).read().split()
        spans.append((float(start), float(end), gpus))
    best = 0
    for s, _, _ in spans:
        active = [g for (a, b, g) in spans if a <= s < b]
        assert len(set(active)) == len(active), f"two tasks shared a GPU: {active}"
        best = max(best, len(active))
    return best


def test_gpu_slots_cap_parallelism_and_get_distinct_gpu_ids(ctx, tmp_path):
    tmp_path = tmp_path / "spans"
    tmp_path.mkdir()
    ctx.resources = {"CPU": 4, "GPU": 2}
    ds = sb.range(8, override_num_blocks=8).map_batches(
        _Recorder, num_gpus=1, fn_constructor_args=(str(tmp_path),), batch_format="pyarrow"
    )
    assert ds.count() == 8
    assert _max_overlap(tmp_path) <= 2


def test_concurrency_caps_an_operator(ctx, tmp_path):
    tmp_path = tmp_path / "spans"
    tmp_path.mkdir()
    ds = sb.range(8, override_num_blocks=8).map_batches(
        _Recorder, num_cpus=0.5, concurrency=1, fn_constructor_args=(str(tmp_path),), batch_format="pyarrow"
    )
    assert ds.count() == 8
    assert _max_overlap(tmp_path) == 1


class _CountConstructions:
    def __init__(self, out_dir):
        with open(os.path.join(out_dir, f"{os.getpid()}-{time.time_ns()}"), "w"):
            pass

    def __call__(self, batch):
        return batch.append_column("pid", pa.array([os.getpid()] * batch.num_rows))


def test_stateful_udf_is_constructed_once_per_worker_process(ctx, tmp_path):
    tmp_path = tmp_path / "constructions"
    tmp_path.mkdir()
    ctx.target_min_block_size = 1  # one task per block: many tasks per worker
    ds = sb.range(400, override_num_blocks=40).map_batches(
        _CountConstructions, num_cpus=0.5, fn_constructor_args=(str(tmp_path),), batch_format="pyarrow"
    )
    pids_used = {row["pid"] for row in ds.take_all()}
    constructions = [name.split("-")[0] for name in os.listdir(tmp_path)]
    assert ds.last_run_stats.ops[1].tasks_done >= 10
    assert len(constructions) == len(set(constructions)), "a worker built the UDF twice"
    assert {int(p) for p in constructions} == pids_used


def test_algorithm_2_replenishes_one_partition_per_pipeline_period():
    """The paper's worked example (section 4.3.2): transform 12 s on 6 slots doubling
    the data, inference 2 s per partition-sized task on 4 slots: P = 2 + 1 = 3 s, so
    the budget grows by one source partition every 3 s."""

    class Op:
        def __init__(self, index, est, slots):
            self.index, self.estimates, self._slots = index, est, slots
            self.is_source, self.buffered_output_bytes = index == 0, 0

        def usable_slots(self):
            return self._slots

    source = Op(0, Estimates(tasks=1, work_s=1, input_bytes=0, output_bytes=100), 2)
    transform = Op(1, Estimates(tasks=1, work_s=12, input_bytes=100, output_bytes=200), 6)
    inference = Op(2, Estimates(tasks=1, work_s=2, input_bytes=100, output_bytes=5), 4)
    policy = AdaptivePolicy(MemoryBudget(limit=10_000))
    policy.budget = 0
    policy.replenish([source, transform, inference], elapsed_s=3.0)
    assert abs(policy.budget - 100) < 1e-6
