"""``random_shuffle`` and ``zip`` as plan nodes: a `ShuffleRows` transform permutes a task's rows,
a `ZipColumns` joins the datasets' slices of a zip task side by side.

The map side is a `ShuffleRows` that joins the operator before the barrier (it fuses
with a read or a map of the same resources, so it adds no tasks there); the barrier
(`execution/operators/repartition.py` with ``shuffle``) gives output block ``j`` the
``j``-th slice of every permuted block; the reduce side is a `ShuffleRows` run by the
barrier's own tasks on the slices they join. No row moves through the driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_streambatch.engine.plan.logical import Repartition, ResourceRequest, Transform
from airflow_streambatch.engine.worker.shuffle_rows import permuted
from airflow_streambatch.engine.worker.zip_columns import zipped

MAP_SIDE, REDUCE_SIDE = 0, 1
ENGINE_OWN = "fail"  # no user function runs here: DataContext.on_row_error="quarantine" has no rows to set aside


@dataclass
class ShuffleRows(Transform):
    """Permute all rows of a task; ``stage`` keeps the map and reduce permutations apart."""

    seed: int | None = None
    stage: int = MAP_SIDE

    def apply(self, tables, env):
        return permuted(tables, self.seed, self.stage, env.task_key)


def random_shuffle_ops(seed: int | None) -> list:
    """The logical nodes of ``random_shuffle(seed=)``: permute, cut into as many blocks as arrive
    (Ray keeps the number of blocks), join and permute again."""
    request = ResourceRequest.make("RandomShuffle", num_cpus=1)
    return [ShuffleRows(name="RandomShuffleMap", compute=request, on_error=ENGINE_OWN, seed=seed, stage=MAP_SIDE),
            Repartition(None, shuffle=True, reduce=ShuffleRows(name="RandomShuffle", compute=request,
                                                               on_error=ENGINE_OWN, seed=seed, stage=REDUCE_SIDE))]


@dataclass
class ZipColumns(Transform):
    """Joins, column-wise, the slices of ``datasets`` datasets a zip task gets (`worker/zip_columns.py`)."""

    datasets: int = 2

    def apply(self, tables, env):
        return zipped(tables, self.datasets)


def zip_ops(datasets: int) -> list:
    """The barrier of ``zip``: output block ``j`` joins the blocks placed ``(j, ...)`` (`repartition.cut`)."""
    request = ResourceRequest.make("Zip", num_cpus=1)
    return [Repartition(None, by_group=True, reduce=ZipColumns(name="Zip", compute=request, on_error=ENGINE_OWN,
                                                                      datasets=datasets))]
