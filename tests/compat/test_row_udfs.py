"""Classes and arguments in row operations (issue 17, item 5).

Ray Data's ``map``, ``flat_map`` and ``filter`` take a callable class, constructed once
(with ``fn_constructor_args``/``fn_constructor_kwargs``) and then called per row, and
``fn_args``/``fn_kwargs`` passed after the row, as ``map_batches`` does.
"""

from __future__ import annotations

import os

import pytest

import airflow_streambatch.engine as rd


class AddOffset:
    """Counts its constructions in a file per process: built once per worker, not per row."""

    def __init__(self, offset, *, log_dir):
        self.offset = offset
        with open(os.path.join(log_dir, f"built-{os.getpid()}-{id(self)}"), "w"):
            pass

    def __call__(self, row, scale=1):
        return {"id": row["id"] * scale + self.offset}


class Repeat:
    def __init__(self, times):
        self.times = times

    def __call__(self, row):
        return [row] * self.times


class KeepAbove:
    def __init__(self, threshold):
        self.threshold = threshold

    def __call__(self, row):
        return row["id"] > self.threshold


def test_a_class_in_map_is_built_once_per_worker_and_called_per_row(ctx, tmp_path):
    log_dir = tmp_path / "built"
    log_dir.mkdir()
    rows = rd.range(40, override_num_blocks=2).map(
        AddOffset, fn_constructor_args=(100,), fn_constructor_kwargs={"log_dir": str(log_dir)},
        fn_kwargs={"scale": 2}).take_all()
    assert sorted(r["id"] for r in rows) == [100 + 2 * i for i in range(40)]
    built = os.listdir(log_dir)
    assert 1 <= len(built) <= len({name.split("-")[1] for name in built}) <= 2  # one per worker process, not per row


def test_classes_in_flat_map_and_filter(ctx):
    assert rd.range(3).flat_map(Repeat, fn_constructor_args=(2,)).count() == 6
    assert sorted(r["id"] for r in rd.range(6).filter(KeepAbove, fn_constructor_args=(3,)).take_all()) == [4, 5]
    assert sorted(r["id"] for r in rd.range(3).map(lambda row, k: {"id": row["id"] + k}, fn_args=(10,))
                  .take_all()) == [10, 11, 12]


def test_constructor_arguments_need_a_class(ctx):
    with pytest.raises(ValueError, match="fn_constructor_args/kwargs apply only when fn is a class"):
        rd.range(3).map(lambda row: row, fn_constructor_args=(1,))
