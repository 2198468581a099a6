"""The per-row error policy on real Spark: ``on_error="quarantine"`` commits a partition's good
rows and sets aside exactly the rows its functions fail on, beside the data, exactly once
(`worker/row_errors.py`, `plan/row_errors.py`). Locally and on the S3 server."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as sb
from airflow_streambatch.engine.filesystems import resolve

ROWS = 200
FILES = 4


@pytest.fixture()
def inputs(tmp_path) -> list[str]:
    """Four Parquet files of 50 rows: ids 0..199, so four input partitions."""
    paths = []
    for i in range(FILES):
        path = str(tmp_path / "in" / f"part-{i}.parquet")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        ids = list(range(i * ROWS // FILES, (i + 1) * ROWS // FILES))
        pq.write_table(pa.table({"id": ids, "text": [f"row {n}" for n in ids]}), path)
        paths.append(path)
    return paths


def _bad(n: int) -> bool:
    return n % 7 == 0


def embed(batch):
    """A batch function that fails for a whole batch when one of its rows is bad."""
    bad = [n for n in batch["id"] if _bad(int(n))]
    if bad:
        raise ValueError(f"cannot embed id {bad[0]}")
    return {"id": batch["id"], "length": [len(t) for t in batch["text"]]}


def _visible_ids(uri: str) -> list[int]:
    """What a plain directory reader sees (``_``-prefixed files skipped, as Spark and pandas skip them)."""
    fs, root = resolve(uri)
    dataset = pads.dataset(root, filesystem=fs, format="parquet", ignore_prefixes=["_", "."])
    return sorted(dataset.to_table(columns=["id"])["id"].to_pylist())


def _quarantined(uri: str, result) -> pa.Table:
    """Every quarantine file the commit records list (and no other under the path)."""
    fs, root = resolve(uri)
    listed = sorted(f"{root}/{name}" for rec in result.committed.values() for name in rec.quarantined)
    found = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(root, recursive=True))
                   if i.type == pafs.FileType.File and i.base_name.startswith("_quarantine-"))
    assert found == listed
    return pa.concat_tables([pq.read_table(path, filesystem=fs) for path in listed]) if listed else None


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_failing_batch_is_halved_down_to_its_bad_rows_which_are_committed_beside_the_good_ones(
        ctx, inputs, tmp_path, s3_bucket, where):
    out = str(tmp_path / "out") if where == "local" else f"{s3_bucket}/out"
    result = sb.read_parquet(inputs).map_batches(embed, batch_size=16, on_error="quarantine").write_parquet(out)

    bad = [n for n in range(ROWS) if _bad(n)]
    assert not result.failed and len(result.committed) == FILES
    assert _visible_ids(out) == [n for n in range(ROWS) if not _bad(n)]  # every good row, once
    aside = _quarantined(out, result)
    rows = [json.loads(r) for r in aside["row"].to_pylist()]
    assert sorted(r["id"] for r in rows) == bad  # every bad row, once
    assert {r["text"] for r in rows} == {f"row {n}" for n in bad}
    assert set(aside["operator"].to_pylist()) == {"MapBatches(embed)"}
    for row, error, partition, label in zip(rows, aside["error"].to_pylist(), aside["partition"].to_pylist(),
                                            aside["input"].to_pylist()):
        assert error == f"ValueError: cannot embed id {row['id']}"
        assert label == result.committed[partition].label
        assert label.endswith(f"part-{row['id'] * FILES // ROWS}.parquet")
    assert sum(rec.quarantined_rows for rec in result.committed.values()) == len(bad)
    assert sum(rec.rows for rec in result.committed.values()) == ROWS - len(bad)


def _explode(row):
    if row["id"] == 3:
        raise KeyError("no words")
    return [{"id": row["id"], "word": w} for w in row["text"].split()]


def _shout(row):
    if row["id"] == 5:
        return {"id": row["id"]}  # other keys than every other row: set aside too, not nulled
    return {"id": row["id"], "word": row["word"].upper()}


def _keep(row):
    if row["id"] == 9:
        raise RuntimeError("undecidable")
    return row["id"] % 2 == 0


def test_row_functions_set_aside_each_failing_row_and_the_context_default_applies_to_all(ctx, inputs, tmp_path):
    ctx.on_row_error = "quarantine"  # no on_error= on the transforms: the context's default applies
    out = str(tmp_path / "out")
    result = sb.read_parquet(inputs).flat_map(_explode).map(_shout).filter(_keep).write_parquet(out)

    assert _visible_ids(out) == sorted(2 * [n for n in range(0, ROWS, 2)])  # two words per even row
    aside = _quarantined(out, result)
    by_operator = {(op, json.loads(row)["id"]) for op, row in zip(aside["operator"].to_pylist(),
                                                                   aside["row"].to_pylist())}
    assert by_operator == {("FlatMap(_explode)", 3), ("Map(_shout)", 5), ("Map(_shout)", 5),
                           ("Filter(_keep)", 9), ("Filter(_keep)", 9)}
    assert aside.num_rows == 5  # row 3 once; rows 5 and 9 once per word
    errors = dict(zip(aside["operator"].to_pylist(), aside["error"].to_pylist()))
    assert errors["FlatMap(_explode)"] == "KeyError: 'no words'"
    assert "different keys" in errors["Map(_shout)"] and errors["Filter(_keep)"] == "RuntimeError: undecidable"


def fail_once(batch, marker_dir: str):
    """A step fused after the quarantining one that fails its task's first attempt (once per input
    file): the retry sets the same rows aside again, and the commit must hold them once."""
    marker = os.path.join(marker_dir, f"seen-{int(batch['id'][0]) * FILES // ROWS}")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise ConnectionError("transient")
    return batch


def test_a_retried_task_commits_the_rows_it_set_aside_once(ctx, inputs, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    out = str(tmp_path / "out")
    result = (sb.read_parquet(inputs).map_batches(embed, batch_size=16, on_error="quarantine")
              .map_batches(fail_once, batch_size=None, fn_kwargs={"marker_dir": str(markers)})
              .write_parquet(out))
    assert len(os.listdir(markers)) == FILES  # every task failed once, and was retried
    assert _visible_ids(out) == [n for n in range(ROWS) if not _bad(n)]
    ids = [json.loads(r)["id"] for r in _quarantined(out, result)["row"].to_pylist()]
    assert sorted(ids) == [n for n in range(ROWS) if _bad(n)]


def test_the_default_fails_the_partition_and_quarantine_needs_a_file_write(ctx, inputs, tmp_path):
    with pytest.raises(sb.PartitionsFailedError, match="cannot embed id 0"):
        sb.read_parquet(inputs[:1]).map_batches(embed).write_parquet(str(tmp_path / "failed"))
    quarantining = sb.read_parquet(inputs).map_batches(embed, on_error="quarantine")
    with pytest.raises(ValueError, match="not written"):
        quarantining.take_all()
    with pytest.raises(ValueError, match="repartition"):
        quarantining.repartition(2).write_parquet(str(tmp_path / "mixed"))
    with pytest.raises(ValueError, match="on_error must be one of"):
        sb.read_parquet(inputs).map(_shout, on_error="skip")
    ctx.on_row_error = "quarantine"  # a default that cannot apply leaves reads that write nothing alone
    assert len(sb.read_parquet(inputs).filter(lambda row: row["id"] < 10).take_all()) == 10
