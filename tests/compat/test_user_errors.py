"""A UDF's exception reaches the caller as its own type (issue 17, item 6).

Ray Data raises an error that is an instance of the UDF's exception class (its
``RayTaskError.as_instanceof_cause()``) and of ``UserCodeException``, so a Ray user's
``pytest.raises(ValueError)`` or ``except KeyError`` works around a consumer. Here the
error is also the engine's `PartitionsFailedError`, which keeps listing every failed
partition (the others still finish), and the task's own exception is its ``__cause__``.
"""

from __future__ import annotations

import pickle
import threading

import pytest

import airflow_streambatch.engine as rd


class ScorerError(Exception):
    """A user's own exception class, importable on the workers and here (this module)."""


def _reject_odd(batch):
    if batch["id"][0] % 2:
        raise ValueError(f"odd block starting at {batch['id'][0]}")
    return batch


def _raise_scorer(row):
    raise ScorerError(f"cannot score {row['id']}")


def test_a_udf_error_is_an_instance_of_its_own_type_with_the_original_as_cause(ctx):
    with pytest.raises(ValueError, match="odd block") as info:  # what a Ray Data test writes
        rd.range(4, override_num_blocks=4).map_batches(_reject_odd).take_all()
    error = info.value
    assert isinstance(error, rd.UserCodeException) and isinstance(error, rd.PartitionsFailedError)
    assert error.failures and {f.partition for f in error.failures} <= {1, 3}  # named; 0 and 2 did not fail
    assert isinstance(error.__cause__, ValueError) and "odd block" in str(error.__cause__)
    assert "input partition(s) failed" in str(error) and not str(error).startswith("'")
    again = pickle.loads(pickle.dumps(error))  # e.g. to a parent process: same types, same failures
    assert isinstance(again, ValueError) and again.failures == error.failures


def test_a_users_own_exception_class_can_be_caught_from_a_row_udf(ctx):
    with pytest.raises(ScorerError, match="cannot score"):
        rd.range(3, override_num_blocks=1).map(_raise_scorer).take_all()


def _mixed(batch):
    if batch["id"][0] == 0:
        raise KeyError("missing")
    raise ValueError("bad")


class _Unpicklable(Exception):
    def __init__(self):
        super().__init__("holds a lock")
        self.lock = threading.Lock()


def _unpicklable(batch):
    raise _Unpicklable()


def test_mixed_or_unpicklable_errors_stay_partitions_failed_errors_that_say_what_happened(ctx):
    ctx.max_failed_partitions = 1  # both partitions fail before the run stops
    with pytest.raises(rd.PartitionsFailedError) as info:
        rd.range(2, override_num_blocks=2).map_batches(_mixed).take_all()
    assert not isinstance(info.value, (KeyError, ValueError))  # no single type to be
    assert isinstance(info.value.__cause__, (KeyError, ValueError))
    assert "KeyError: 'missing'" in str(info.value) and "ValueError: bad" in str(info.value)

    ctx.max_failed_partitions = 0
    with pytest.raises(rd.PartitionsFailedError, match="_Unpicklable: holds a lock") as info:
        rd.range(1).map_batches(_unpicklable).take_all()
    assert info.value.__cause__ is None and "Traceback" in info.value.failures[0].traceback
