"""Ray Data's argument checks for ``repartition`` and ``random_sample``, with Ray's error texts.

Kept apart from `Dataset` so the methods stay one line of intent each; the texts are
Ray's own (a pipeline, or a test, that expects Ray's ``ValueError`` gets it here too).
"""

from __future__ import annotations

import warnings

from airflow_streambatch.engine.errors import check_positive_int
from airflow_streambatch.engine.plan.logical import InputBlocks, Read, Repartition


def repartition_op(num_blocks, target_num_rows_per_block, *, strict: bool, shuffle: bool, keys, sort: bool
                   ) -> Repartition:
    """The `Repartition` node for Ray's ``repartition`` arguments, checked in Ray's order.

    ``target_num_rows_per_block`` cuts blocks of exactly that many rows (the last holds
    the rest), which is what Ray promises with ``strict=True`` and more than it promises
    without (blocks of at most that many rows). ``keys`` (hash partitioning) and ``sort``
    are not supported: refused, naming them, as they would change which rows share a block.
    """
    if target_num_rows_per_block is not None:
        for name, given in (("keys", keys is not None), ("sort", sort is not False), ("shuffle", bool(shuffle))):
            if given:
                warnings.warn(f"`{name}` is ignored when `target_num_rows_per_block` is set.", stacklevel=3)
    if num_blocks is None and target_num_rows_per_block is None:
        raise ValueError("Either `num_blocks` or `target_num_rows_per_block` must be set")
    if num_blocks is not None and target_num_rows_per_block is not None:
        raise ValueError("Only one of `num_blocks` or `target_num_rows_per_block` must be set, but not both.")
    if target_num_rows_per_block is not None and shuffle:
        raise ValueError("`shuffle` must be False when `target_num_rows_per_block` is set.")
    if not isinstance(strict, bool) or not isinstance(shuffle, bool):
        raise TypeError(f"repartition: strict and shuffle must be True or False, got strict={strict!r}, "
                        f"shuffle={shuffle!r}")
    if target_num_rows_per_block is not None:
        check_positive_int(target_num_rows_per_block, "repartition(target_num_rows_per_block)")
        return Repartition(None, rows_per_block=target_num_rows_per_block)
    check_positive_int(num_blocks, "repartition(num_blocks): num_blocks")
    if keys is not None or sort:
        raise ValueError(f"repartition(keys={keys!r}, sort={sort!r}): hash partitioning by key columns and sorted "
                         "blocks are not supported by this engine; use repartition(num_blocks) or "
                         "repartition(num_blocks, shuffle=True)")
    return Repartition(num_blocks, shuffle=shuffle)


def check_sample(logical: list, fraction) -> None:
    """Ray's checks of ``random_sample``: a source known to hold no rows (``range(0)``,
    ``from_items([])``, an empty materialized dataset), then ``0 <= fraction <= 1``."""
    source = logical[0]
    empty = (isinstance(source, Read) and source.datasource.num_rows == 0) or (
        isinstance(source, InputBlocks) and not any(ref.num_rows for ref in source.blocks))
    if empty:
        raise ValueError("Cannot sample from an empty Dataset.")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"random_sample: fraction must be a number between 0 and 1, got {fraction!r}")
    if fraction < 0 or fraction > 1:
        raise ValueError(f"Fraction must be between 0 and 1. (random_sample: fraction must be between 0 and 1, "
                         f"got {fraction!r})")  # Ray's text, then this engine's earlier one
