"""Epochs read with ``columns`` and a row filter (issue 33, item 4): every manifest partition (a
file, or a row-group range of a large one) reads only its own row groups, pruned, and commits
exactly once, with the rows that passed; a range the filter rules out commits empty. Local
files and the tests' S3 server (moto's), on real local Spark."""

from __future__ import annotations

import glob

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pruning_data import EN_IDS, write_langs

from airflow_streambatch.epochs import EpochManifest, list_inputs, run_epoch

START, END = "2026-11-22T10:00:00+00:00", "2026-11-22T11:00:00+00:00"
RANGE_BYTES = 600 * 1024  # two of the ~250 KiB row groups per range: (0, 2), (2, 4), (4, 6), (6, 8)


def _committed(record) -> list[tuple[int, int]]:
    return [(p.index, p.rows) for p in record.partitions if p.state == "committed"]


def _local_output(out) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in sorted(glob.glob(f"{out}/p*/*.parquet"))])


def test_row_group_ranges_are_pruned_and_each_commits_once(ctx, tmp_path):
    (tmp_path / "in").mkdir()
    write_langs(str(tmp_path / "in" / "langs.parquet"))
    manifest = EpochManifest(START, END, list_inputs(str(tmp_path / "in"))).split(RANGE_BYTES)
    assert [p.row_groups for p in manifest.partitions] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    out = str(tmp_path / "out")

    def pipeline(ds, epoch):
        return ds

    record = run_epoch(manifest, pipeline, output_path=out, columns=["id"], row_filter=pc.field("lang") == "en")
    assert record.status == "succeeded"
    # ranges 1 and 2 hold only "de" and "fr": they commit, empty
    assert _committed(record) == [(0, 500), (1, 0), (2, 0), (3, 500)]
    table = _local_output(out)
    assert table.column_names == ["id"] and sorted(table["id"].to_pylist()) == EN_IDS

    again = run_epoch(manifest, pipeline, output_path=out, columns=["id"], row_filter=pc.field("lang") == "en")
    assert not any(p.this_try for p in again.partitions)  # committed once: nothing ran again
    assert sorted(_local_output(out)["id"].to_pylist()) == EN_IDS


def test_a_pruned_epoch_on_the_s3_server(ctx, tmp_path, s3_bucket):
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    write_langs(f"{bucket}/in/langs.parquet", filesystem=fs)
    manifest = EpochManifest(START, END, list_inputs(f"{s3_bucket}/in")).split(RANGE_BYTES)
    assert len(manifest.partitions) == 4
    record = run_epoch(manifest, lambda ds, epoch: ds, output_path=f"{s3_bucket}/out", columns=["lang", "id"],
                       row_filter=(pc.field("id") >= 250) & (pc.field("id") < 1750))
    assert _committed(record) == [(0, 250), (1, 500), (2, 500), (3, 250)]
    files = [f.path for f in fs.get_file_info(pafs.FileSelector(f"{bucket}/out", recursive=True))
             if f.path.endswith(".parquet")]
    table = pa.concat_tables([pq.read_table(f, filesystem=fs) for f in files])
    assert table.column_names == ["lang", "id"] and sorted(table["id"].to_pylist()) == list(range(250, 1750))


def test_a_csv_epoch_is_pruned_in_its_read_tasks(ctx, tmp_path):
    (tmp_path / "in").mkdir()
    for part in range(2):
        ids = list(range(100 * part, 100 * part + 100))
        pacsv.write_csv(pa.table({"id": ids, "lang": ["en" if i % 4 else "de" for i in ids]}),
                        tmp_path / "in" / f"part-{part}.csv")
    manifest = EpochManifest(START, END, list_inputs(str(tmp_path / "in")))
    record = run_epoch(manifest, lambda ds, epoch: ds, output_path=str(tmp_path / "out"), input_format="csv",
                       columns=["id"], row_filter=pc.field("lang") == "de")
    assert _committed(record) == [(0, 25), (1, 25)]
    table = _local_output(tmp_path / "out")
    assert table.column_names == ["id"] and sorted(table["id"].to_pylist()) == list(range(0, 200, 4))
