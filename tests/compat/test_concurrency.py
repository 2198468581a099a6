"""``concurrency`` as Ray Data checks it (issue 17, item 9).

Ray's forms: ``n`` for a function or a class; for a class also an actor pool ``(min, max)``
or ``(min, max, initial)`` with ``min <= initial <= max``; a tuple for a function is an error.
Here the pool's maximum caps the running tasks and, for a class, the live instances
(`test_live_instances.py`): see docs/ray-compatibility.md.
"""

from __future__ import annotations

import pytest

import airflow_streambatch.engine as rd


class Identity:
    def __call__(self, batch):
        return batch


@pytest.mark.parametrize("fn,concurrency,message", [
    (lambda b: b, (2, 4), r"is a tuple \(an actor pool\), but fn is not a callable class"),
    (Identity, (1, 3, 5), r"needs min <= initial <= max"),
    (Identity, (4, 2), r"needs min <= initial <= max"),
    (Identity, (1, 2, 3, 4), r"must be n, \(min, max\) or \(min, max, initial\)"),
    (Identity, (0, 2), r"each value of concurrency=\(0, 2\) must be a positive integer"),
    (lambda b: b, 0, r"concurrency must be a positive integer"),
])
def test_invalid_concurrency_is_refused_as_ray_refuses_it(fn, concurrency, message):
    with pytest.raises(ValueError, match=message):
        rd.range(4).map_batches(fn, concurrency=concurrency)


def test_valid_forms_run_with_the_pools_maximum_as_the_cap(ctx):
    from airflow_streambatch.engine.plan.logical import ResourceRequest

    ds = rd.range(8, override_num_blocks=4)
    assert ds.map_batches(Identity, concurrency=(1, 2)).count() == 8
    assert ds.map_batches(Identity, concurrency=(1, 2, 1)).count() == 8
    assert ds.map(lambda row: row, concurrency=1).count() == 8
    assert ResourceRequest.make("op", concurrency=(1, 3, 2), fn=Identity).concurrency == 3
