"""Ray Data's ``union``, ``zip``, ``random_shuffle`` and ``streaming_split`` on `Dataset`.

``union`` takes the honest simple route: it materializes each dataset (each runs as a plan
of its own, once, when ``union`` is called) and the result is one plan whose source is all
of their blocks: one input partition per distinct partition of each, so a write of it
commits each exactly once. ``random_shuffle`` is Ray's two-stage shuffle built on the
repartition barrier (`plan/shuffle.py`); ``zip`` materializes too, cuts the other datasets'
blocks at this one's block boundaries (references only) and joins each place's slices in one
task of that barrier. ``streaming_split`` is Ray's name for `iter_split`.
"""

from __future__ import annotations

from dataclasses import replace

from airflow_streambatch.engine.execution.lineage import base_id
from airflow_streambatch.engine.plan.logical import InputBlocks, Read
from airflow_streambatch.engine.execution.operators.repartition import slice_rows
from airflow_streambatch.engine.plan.shuffle import random_shuffle_ops, zip_ops


class DatasetCombine:
    """Mixed into `Dataset`; relies on its ``materialize``, ``iter_split``, ``_with`` and ``context``."""

    def union(self, *other):
        """The rows of this dataset and of each of ``other``, in that order where order is kept
        (``preserve_order``, ``take_all``). Runs every dataset now (it materializes them), so the
        union reads their blocks without running them again."""
        from airflow_streambatch.engine.dataset import Dataset

        datasets = [self, *_datasets(other, "union")]
        blocks, lineage, owners, numbers = [], {}, [], {}
        for i, dataset in enumerate(datasets):
            source = _blocks_of(dataset)
            owners.append(source.owner)  # keeps each one's block files while the union can read them
            for ref in source.blocks:
                part = numbers.setdefault((i, ref.partitions), len(numbers))  # a partition of the union's run
                blocks.append(_renamed(f"u{i}", ref, source, lineage, partitions=(part,), order=(i, *ref.order)))
        # a union of bare reads keeps them, so its lineage can be serialized (`lineage_serialization.py`)
        reads = tuple(d._logical[0] for d in datasets) if all(
            len(d._logical) == 1 and isinstance(d._logical[0], Read) for d in datasets) else None
        return Dataset([InputBlocks(tuple(blocks), lineage, tuple(owners), None, reads)], self._context)

    def zip(self, *other):
        """The columns of this dataset and of each of ``other`` side by side, row ``i`` with row ``i``
        (Ray's ``zip``); a column name already taken is renamed ``name_1`` (``name_2``, ...). Every
        dataset must have as many rows. Runs each dataset now (it materializes them); the join runs
        as one task per block of this dataset, each joining the rows of every dataset at its place."""
        from airflow_streambatch.engine.dataset import Dataset

        sources = [_blocks_of(d) for d in (self, *_datasets(other, "zip"))]
        refs = [[ref for ref in source.blocks if ref.num_rows] for source in sources]
        totals = [sum(ref.num_rows for ref in blocks) for blocks in refs]
        for total in totals[1:]:
            if total != totals[0]:
                raise ValueError(f"Cannot zip datasets of different number of rows: {totals[0]}, {total}")
        bounds = [0]
        for ref in refs[0]:  # this dataset's blocks set where every other one is cut
            bounds.append(bounds[-1] + ref.num_rows)
        blocks, lineage = [], {}
        for d, (source, mine) in enumerate(zip(sources, refs)):
            for j, pieces in enumerate(slice_rows(mine, bounds)[0]):
                blocks.extend(_renamed(f"z{d}", piece, source, lineage, partitions=(j,), order=(j, d, s))
                              for s, piece in enumerate(pieces))
        owners = tuple(source.owner for source in sources)  # each one's block files live while the zip can read
        return Dataset([InputBlocks(tuple(blocks), lineage, owners, None), *zip_ops(len(sources))], self._context)

    def random_shuffle(self, *, seed: int | None = None, num_blocks: int | None = None, **ray_remote_args):
        """Every row in a random order, by Ray's shuffle: each block's rows permuted and cut into one
        slice per output block, each output block the join of its slices permuted again (as many
        output blocks as input blocks). ``seed``: the same order on every run over the same blocks."""
        if num_blocks is not None:
            raise DeprecationWarning(
                "`num_blocks` parameter is deprecated in Ray 2.9. random_shuffle() does not support to change "
                "the number of output blocks. Use repartition() instead.")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"random_shuffle: seed must be an integer >= 0 or None, got {seed!r}")
        if ray_remote_args:
            raise TypeError(f"random_shuffle: Ray's remote arguments {sorted(ray_remote_args)} have no meaning "
                            "here (shuffle tasks take one CPU slot each)")
        dataset = self
        for op in random_shuffle_ops(seed):
            dataset = dataset._with(op)
        return dataset

    def streaming_split(self, n: int, *, equal: bool = False, locality_hints: list | None = None):
        """Ray's ``streaming_split``: ``n`` iterators over one shared execution (`iter_split`).
        ``locality_hints`` (Ray node ids) are checked as Ray checks them and otherwise unused: Spark
        places the tasks, and a consumer takes whichever block is ready."""
        if locality_hints is not None and len(locality_hints) != n:
            raise ValueError(f"The length of locality_hints {len(locality_hints)} doesn't equal the number of "
                             f"splits {n}.")
        return self.iter_split(n, equal=equal)


def _datasets(other: tuple, where: str) -> tuple:
    """``other``, each checked to be a `Dataset` (``union``'s and ``zip``'s arguments)."""
    from airflow_streambatch.engine.dataset import Dataset

    wrong = [type(d).__name__ for d in other if not isinstance(d, Dataset)]
    if wrong:
        raise TypeError(f"{where}: every argument must be a Dataset, got {', '.join(wrong)}")
    return other


def _renamed(prefix: str, ref, source: InputBlocks, lineage: dict, **changes):
    """``ref`` under an id unique in the combined run (two runs number their blocks alike), with
    the lineage record that rebuilds its file if it is lost (replaying the task that made it)."""
    renamed = replace(ref, block_id=f"{prefix}.{ref.block_id}", **changes)
    record = source.lineage.get(base_id(ref))
    if record is not None:
        lineage[base_id(renamed)] = record
    return renamed


def _blocks_of(dataset) -> InputBlocks:
    """The existing blocks of ``dataset``: its own when it is only blocks (a materialized dataset, a
    union), so their owner stays referenced by what is built on them; else those of a run of it now."""
    if len(dataset._logical) == 1 and isinstance(dataset._logical[0], InputBlocks):
        return dataset._logical[0]
    return dataset.materialize()._logical[0]
