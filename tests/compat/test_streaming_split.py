"""``iter_split(n)``, Ray Data's ``streaming_split`` (issue 17, item 8).

Ray documents that the ``n`` iterators share one execution, that ``equal=True`` gives
each the same number of rows (dropping what cannot be divided), and that each iterator
can be iterated again for another epoch (every consumer of a training job does).
Consumers here run in threads, as Ray's training workers each hold one iterator.
"""

from __future__ import annotations

import threading

import pytest

import airflow_streambatch.engine as rd


def _consume_all(shards, epochs=1) -> list[list[list[int]]]:
    """ids per epoch per consumer, each consumer in its own thread."""
    seen = [[[] for _ in shards] for _ in range(epochs)]
    errors = []

    def consume(i):
        try:
            for epoch in range(epochs):
                for batch in shards[i].iter_batches(batch_size=None, batch_format="pyarrow"):
                    seen[epoch][i].extend(batch["id"].to_pylist())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(shards))]
    [t.start() for t in threads]
    [t.join(timeout=300) for t in threads]
    assert not errors and not any(t.is_alive() for t in threads), errors
    return seen


def test_blocks_are_dealt_to_the_consumer_with_the_fewest_rows(ctx):
    [seen] = _consume_all(rd.range(1000, override_num_blocks=10).iter_split(3))
    assert sorted(i for ids in seen for i in ids) == list(range(1000))
    counts = [len(ids) for ids in seen]
    assert max(counts) - min(counts) <= 100  # within one block, whoever reads faster


def test_equal_splits_have_exactly_equal_rows_and_drop_the_remainder(ctx):
    [seen] = _consume_all(rd.range(1000, override_num_blocks=7).iter_split(3, equal=True))
    assert [len(ids) for ids in seen] == [333, 333, 333]
    assert len({i for ids in seen for i in ids}) == 999  # one row dropped, none twice


def test_each_iterator_can_be_iterated_again_for_another_epoch(ctx):
    epochs = _consume_all(rd.range(200, override_num_blocks=4).iter_split(2, equal=True), epochs=2)
    for seen in epochs:
        assert sorted(i for ids in seen for i in ids) == list(range(200)) and len(seen[0]) == len(seen[1]) == 100


def test_a_consumer_that_never_reads_is_reported_not_waited_for_forever(ctx):
    ctx.stall_timeout_s = 5
    first, _ = rd.range(100, override_num_blocks=2).iter_split(2)
    list(first.iter_rows())  # its own share: the other consumer's blocks are queued for it
    with pytest.raises(TimeoutError, match=r"consumer 0 waits to start epoch 2 until consumers \[1\] finish epoch 1"):
        list(first.iter_rows())
