"""Read pruning (issue 33, item 4; issue 32's ``read_parquet(filter=)``): ``columns=`` and a pyarrow
filter pushed into the Parquet scan, on real local Spark, local files and the tests' S3 server.

Ray Data passes ``read_parquet(filter=...)`` through `pyarrow.parquet.filters_to_expression`
to pyarrow's scan: rows failing the filter are dropped, and (pyarrow's doing) row groups
whose statistics exclude it are not read. The pruning is shown with `counting_fs`, a
filesystem wrapper that counts the bytes pyarrow fetches on the executors: a file of 8 row
groups with a large column nobody asks for, read with ``columns=["id"]`` and a filter that
4 row groups' statistics exclude, fetches a small fraction of what a full read fetches.
"""

from __future__ import annotations

import base64
import os
import pickle

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as pds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from counting_fs import bytes_read, counting_filesystem
from pruning_data import EN_IDS, LANGS, ROWS, write_langs

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.plan.datasource import Fragment
from airflow_streambatch.engine.read_api import read_fragments
from airflow_streambatch.engine.read_pruning import decode_filter, encode_filter


def _ids(ds) -> list[int]:
    return sorted(row["id"] for row in ds.take_all())


# -- Ray's semantics ---------------------------------------------------------------------------
def test_filter_as_ray_reads_it_on_a_partitioned_dataset(ctx, tmp_path):
    """Ray's test_parquet_read_partitioned_with_filter: a filter on a data column, Hive partition
    columns added, one or two read tasks (one of them then reads no row)."""
    table = pa.table({"one": [1, 1, 1, 3, 3, 3], "two": ["a", "a", "b", "b", "c", "c"]})
    pq.write_to_dataset(table, root_path=str(tmp_path), partition_cols=["one"])
    for blocks in (1, 2):
        ds = rd.read_parquet(str(tmp_path), override_num_blocks=blocks, filter=(pds.field("two") == "a"))
        assert sorted([r["one"], r["two"]] for r in ds.take_all()) == [["1", "a"], ["1", "a"]]
        assert ds.count() == 2
    # pyarrow's DNF form, as Ray hands `filter` to pyarrow.parquet.filters_to_expression
    ds = rd.read_parquet(str(tmp_path), filter=[[("two", "=", "b")], [("two", "=", "c")]])
    assert sorted(r["two"] for r in ds.take_all()) == ["b", "b", "c", "c"]


def test_a_filter_may_name_columns_left_out_partition_columns_and_the_path(ctx, tmp_path):
    root = tmp_path / "in"
    for country in ("US", "NZ"):
        (root / f"country={country}").mkdir(parents=True)
        pq.write_table(pa.table({"id": [1, 2, 3], "v": [10, 20, 30]}), root / f"country={country}" / "a.parquet")
    both = rd.read_parquet(str(root), columns=["id"], filter=(pc.field("v") >= 20) & (pc.field("country") == "NZ"))
    assert both.take_all() == [{"id": 2}, {"id": 3}] and both.columns() == ["id"]
    named = rd.read_parquet(str(root), columns=["country", "id"], filter=pc.field("v") == 10)
    assert sorted((r["country"], r["id"]) for r in named.take_all()) == [("NZ", 1), ("US", 1)]
    us = str(root / "country=US" / "a.parquet")
    by_path = rd.read_parquet(str(root), include_paths=True, columns=["v"], filter=pc.field("path") == us)
    assert sorted((r["v"], r["path"]) for r in by_path.take_all()) == [(10, us), (20, us), (30, us)]


def test_wrong_columns_and_filters_are_refused_naming_the_argument(ctx, tmp_path):
    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [1], "lang": ["en"]}), path)
    with pytest.raises(TypeError, match=r"read_parquet: columns must be a list of column names"):
        rd.read_parquet(path, columns="id")
    with pytest.raises(TypeError, match=r"read_parquet: filter must be a pyarrow.compute.Expression"):
        rd.read_parquet(path, filter="lang == 'en'")
    # checked against the first file in the driver, before any task runs
    with pytest.raises(ValueError, match=r"filter=\(langs == \"en\"\) does not fit .*a.parquet.*No match for"):
        rd.read_parquet(path, filter=pc.field("langs") == "en").take_all()
    with pytest.raises(ValueError, match=r"filter=\(lang == 1\) does not fit .*has no kernel"):
        rd.read_parquet(path, filter=pc.field("lang") == 1).take_all()
    with pytest.raises(rd.PartitionsFailedError, match=r"columns=\['id', 'nope'\] names \['nope'\]"):
        rd.read_parquet(path, columns=["id", "nope"]).take_all()


# -- the pruning is real --------------------------------------------------------------------------
def test_columns_and_filter_skip_row_groups_and_columns_in_the_parquet_scan(ctx, tmp_path):
    write_langs(str(tmp_path / "langs.parquet"))
    log = tmp_path / "reads"
    counted = counting_filesystem(pafs.LocalFileSystem(), log)
    path = str(tmp_path / "langs.parquet")

    everything = rd.read_parquet(path, filesystem=counted)
    assert everything.materialize().count() == 2000  # a run: count() alone reads the footers only
    full = bytes_read(log)
    assert full > os.path.getsize(path) * 0.9  # every column chunk of every row group

    none = rd.read_parquet(path, filesystem=counted, columns=["id"], filter=pc.field("lang") == "es")
    assert none.take_all() == []
    footers = bytes_read(log)  # every row group's statistics exclude "es": the footers, read by each task

    pruned = rd.read_parquet(path, filesystem=counted, columns=["id"], filter=pc.field("lang") == "en")
    rows = pruned.take_all()
    assert sorted(r["id"] for r in rows) == EN_IDS and set(rows[0]) == {"id"}
    some = bytes_read(log)
    # beyond the footers: 4 of 8 row groups fetched, and of those only id and lang (the filter's column),
    # never big, which is almost all of the data a full read fetches
    assert footers < some and some - footers < (full - footers) * 0.02, (footers, some, full)


def test_a_row_group_range_reads_only_its_row_groups_filtered(ctx, tmp_path):
    """An epoch manifest's row-group ranges: fragment i reads its row groups only, and of those the
    ones the filter may match; a range the statistics rule out yields no row and fetches no data."""
    path = str(tmp_path / "langs.parquet")
    write_langs(path)
    size = os.path.getsize(path)
    log = tmp_path / "reads"
    counted = counting_filesystem(pafs.LocalFileSystem(), log)
    ranges = [(0, 1, 2, 3), (4, 5), (6, 7)]
    fragments = [Fragment(path, size // 3, rows) for rows in ranges]
    ds = read_fragments(fragments, columns=["id", "lang"], filter=pc.field("lang") != "fr")
    assert _ids(ds) == [i for i in range(2000) if LANGS[i // ROWS] != "fr"]

    for groups, expected in zip(ranges, ([0, 1], [], [6, 7])):
        one = read_fragments([Fragment(path, size // 3, groups)], columns=["id"], filter=pc.field("lang") == "en")
        assert _ids(one) == [250 * g + r for g in expected for r in range(ROWS)]
    # and the bytes: the (4, 5) range of "de" and "fr" fetches nothing but the footer
    from airflow_streambatch.engine.parquet_ranges import read_row_groups
    from airflow_streambatch.engine.read_options import HIVE, file_options

    opts = file_options("read_fragments", filesystem=counted, partitioning=HIVE)
    schema = pq.ParquetFile(path).schema_arrow
    bytes_read(log)
    english = pc.field("lang") == "en"
    assert list(read_row_groups(Fragment(path, 1, (4, 5)), opts, schema, path, ["id"], english)) == []
    footer_only = bytes_read(log)
    tables = list(read_row_groups(Fragment(path, 1, (0, 1, 2, 3)), opts, schema, path, ["id"], english))
    assert sum(t.num_rows for t in tables) == 500 and tables[0].column_names == ["id"]
    assert footer_only < bytes_read(log) < 0.05 * size


def test_pruned_reads_on_the_s3_server(ctx, tmp_path, s3_bucket):
    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    write_langs(f"{bucket}/in/langs.parquet", filesystem=fs)
    ds = rd.read_parquet(f"{s3_bucket}/in", columns=["id", "lang"], filter=pc.field("lang") == "en")
    rows = ds.take_all()
    assert sorted(r["id"] for r in rows) == EN_IDS and {r["lang"] for r in rows} == {"en"}

    log = tmp_path / "reads"
    counted = counting_filesystem(fs, log)
    assert rd.read_parquet(f"{bucket}/in/langs.parquet", filesystem=counted).materialize().count() == 2000
    full = bytes_read(log)
    pruned = rd.read_parquet(f"{bucket}/in/langs.parquet", filesystem=counted, columns=["id"],
                             filter=pc.field("lang") == "en")
    assert _ids(pruned) == EN_IDS
    some = bytes_read(log)
    assert rd.read_parquet(f"{bucket}/in/langs.parquet", filesystem=counted, columns=["id"],
                           filter=pc.field("lang") == "es").count() == 0
    footers = bytes_read(log)
    assert footers < some and some - footers < (full - footers) * 0.02, (footers, some, full)
    size = fs.get_file_info(f"{bucket}/in/langs.parquet").size
    ranged = read_fragments([Fragment(f"{s3_bucket}/in/langs.parquet", size, (2, 3, 4, 5, 6))], columns=["id"],
                            filter=pc.field("lang") == "en")
    assert _ids(ranged) == list(range(1500, 1750))


# -- formats without statistics: applied in the read task -----------------------------------------
def test_csv_and_json_fragments_are_pruned_after_parsing_byte_ranges_included(ctx, tmp_path):
    table = pa.table({"id": list(range(100)), "lang": ["en" if i % 3 else "de" for i in range(100)],
                      "text": [f"row {i}" for i in range(100)]})
    csv = tmp_path / "rows.csv"
    pacsv.write_csv(table, csv)
    size = os.path.getsize(csv)
    halves = [Fragment(str(csv), size // 2, byte_range=(0, size // 2)),
              Fragment(str(csv), size - size // 2, byte_range=(size // 2, size))]
    ds = read_fragments(halves, "csv", columns=["text", "id"], filter=pc.field("lang") == "de")
    rows = sorted(ds.take_all(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(0, 100, 3)) and list(rows[0]) == ["text", "id"]

    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(f'{{"id": {i}, "lang": "{"en" if i % 3 else "de"}"}}\n' for i in range(100)))
    ds = read_fragments([Fragment(str(jsonl), os.path.getsize(jsonl))], "json", columns=["id"],
                        filter=pc.field("lang") == "en")
    assert _ids(ds) == [i for i in range(100) if i % 3]
    with pytest.raises(rd.PartitionsFailedError, match=r"columns=\['nope'\] names \['nope'\]"):
        read_fragments(halves, "csv", columns=["nope"]).take_all()
    with pytest.raises(rd.PartitionsFailedError, match=r"filter=\(langs == \"de\"\) does not fit"):
        read_fragments(halves, "csv", filter=pc.field("langs") == "de").take_all()


# -- the filter in a spark-submit spec --------------------------------------------------------------
def test_a_filter_travels_as_text_and_nothing_but_an_expression_is_unpickled():
    expr = (pc.field("lang") == "en") & pc.field("id").isin([1, 2]) & (pc.field("score") > pa.scalar(0.5))
    assert decode_filter(encode_filter(expr)).equals(expr) and encode_filter(None) is None

    class Boom:
        def __reduce__(self):
            return os.system, ("echo pwned",)

    with pytest.raises(pickle.UnpicklingError, match="may hold only a pyarrow expression, not posix.system"):
        decode_filter(base64.b64encode(pickle.dumps(Boom())).decode())
