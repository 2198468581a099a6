"""Data that used to be lost or garbled silently now fails loudly, naming what to fix (review issue 12).

* rows of ``map`` / ``flat_map`` with different keys (a column dropped, another nulled);
* CSV files whose columns infer to different types;
* an output path that overlaps an input path (`check_disjoint`), and the input
  paths each file reader hands to the writers for that check.
"""

from __future__ import annotations

import os

import pytest

import airflow_streambatch.engine as sb
from airflow_streambatch.engine.filesystems import check_disjoint
from airflow_streambatch.engine.plan.logical import Read


# -- D: rows with different keys ------------------------------------------------------
def _a_or_b(row):
    return {"a": 1} if row["id"] % 2 else {"b": 2}


def test_map_rows_with_different_keys_fail_naming_the_operator_and_both_key_sets(ctx):
    with pytest.raises(sb.PartitionsFailedError) as info:
        sb.range(10, override_num_blocks=1).map(_a_or_b).take_all()  # one task sees both key sets
    text = str(info.value)
    assert "Map(_a_or_b)" in text and "different keys" in text
    assert "['a']" in text and "['b']" in text


def test_flat_map_rows_with_different_keys_fail_too(ctx):
    def explode(row):
        return [{"x": row["id"]}, {"x": row["id"], "y": 0}]

    with pytest.raises(sb.PartitionsFailedError) as info:
        sb.range(4).flat_map(explode).take_all()
    text = str(info.value)
    assert "FlatMap(explode)" in text and "['x']" in text and "['x', 'y']" in text


def test_rows_with_the_same_keys_in_another_order_still_pass(ctx):
    def reordered(row):
        return {"id": row["id"], "v": 1} if row["id"] % 2 else {"v": 1, "id": row["id"]}

    rows = sb.range(10).map(reordered).take_all()
    assert sorted(r["id"] for r in rows) == list(range(10)) and all(r["v"] == 1 for r in rows)


# -- C: CSV column types that differ between files --------------------------------------
def test_csv_column_changing_type_between_files_names_file_column_and_types(ctx, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text("id,amount\n1,10\n2,20\n")
    (tmp_path / "in" / "b.csv").write_text("id,amount\n3,ten\n4,twenty\n")
    with pytest.raises(sb.PartitionsFailedError) as info:
        sb.read_csv(str(tmp_path / "in"), override_num_blocks=2).take_all()
    text = str(info.value)
    assert "b.csv" in text and "a.csv" in text  # the drifted file, and the one it is compared with
    assert "'amount' is string not int64" in text
    assert "convert_options" in text  # the argument that fixes it


def test_csv_value_that_does_not_fit_the_type_inferred_from_the_first_rows_names_the_column(ctx, tmp_path):
    (tmp_path / "in").mkdir()
    rows = "".join(f"{i},{i}\n" for i in range(300_000))  # past Arrow's first 1 MiB block, where types are inferred
    (tmp_path / "in" / "a.csv").write_text(f"id,amount\n{rows}300000,ten\n")
    with pytest.raises(sb.PartitionsFailedError) as info:
        sb.read_csv(str(tmp_path / "in")).count()
    text = str(info.value)
    assert "a.csv" in text and "column 'amount' (typed int64 from the file's first rows)" in text
    assert "convert_options" in text


def test_csv_files_that_agree_read_and_an_empty_column_takes_the_first_files_type(ctx, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text("id,note\n1,x\n")
    (tmp_path / "in" / "b.csv").write_text("id,note\n2,\n")  # note is all-empty: Arrow infers null
    rows = sb.read_csv(str(tmp_path / "in"), override_num_blocks=2).take_all()
    assert sorted(rows, key=lambda r: r["id"]) == [{"id": 1, "note": "x"}, {"id": 2, "note": None}]


def test_csv_column_types_can_be_set_with_convert_options(ctx, tmp_path):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.csv").write_text("id,amount\n1,10\n")
    (tmp_path / "in" / "b.csv").write_text("id,amount\n3,ten\n")
    options = pacsv.ConvertOptions(column_types={"amount": pa.string()})
    rows = sb.read_csv(str(tmp_path / "in"), convert_options=options, override_num_blocks=2).take_all()
    assert sorted(r["amount"] for r in rows) == ["10", "ten"]


# -- A: output paths overlapping input paths --------------------------------------------
def test_check_disjoint_refuses_output_equal_to_inside_or_containing_an_input(tmp_path):
    inp = str(tmp_path / "in")
    os.makedirs(inp)
    for output, relation in [(inp, "is the same path as"), (inp + "/", "is the same path as"),
                             (f"file://{inp}", "is the same path as"), (f"{inp}/out", "lies inside"),
                             (f"{inp}/../in/out", "lies inside"), (str(tmp_path), "contains")]:
        with pytest.raises(ValueError, match="write_parquet: output path") as info:
            check_disjoint([inp, str(tmp_path / "other")], output, "write_parquet")
        assert relation in str(info.value) and repr(inp) in str(info.value) and repr(output) in str(info.value)
    check_disjoint([inp], str(tmp_path / "in2"), "w")  # a common prefix is not containment
    check_disjoint([inp], str(tmp_path / "out"), "w")
    check_disjoint([inp], f"s3://bucket{inp}/out", "w")  # another filesystem


def test_check_disjoint_sees_through_symlinks_and_relative_paths(tmp_path, monkeypatch):
    (tmp_path / "data" / "in").mkdir(parents=True)
    os.symlink(tmp_path / "data", tmp_path / "link")
    with pytest.raises(ValueError, match="lies inside"):
        check_disjoint([str(tmp_path / "data" / "in")], str(tmp_path / "link" / "in" / "out"), "w")
    monkeypatch.chdir(tmp_path / "data")
    with pytest.raises(ValueError, match="contains"):
        check_disjoint([str(tmp_path / "link" / "in" / "f.parquet")], ".", "w")


def test_check_disjoint_compares_other_filesystems_by_scheme_bucket_and_path():
    with pytest.raises(ValueError, match="lies inside"):
        check_disjoint(["s3://bucket/in/"], "s3://bucket/in/out", "w")
    with pytest.raises(ValueError, match="contains"):
        check_disjoint(["gs://b/data/in/x.parquet"], "gs://b/data", "w")
    check_disjoint(["s3://bucket/in"], "s3://other/in/out", "w")
    check_disjoint(["s3://bucket/in"], "gs://bucket/in/out", "w")


def test_every_file_reader_records_its_input_paths():
    def paths(ds):
        read = ds._logical[0]
        assert isinstance(read, Read)
        return read.datasource.paths

    assert paths(sb.read_parquet("/data/in")) == ("/data/in",)
    assert paths(sb.read_csv(["/a.csv", "/b.csv"])) == ("/a.csv", "/b.csv")
    assert paths(sb.read_json("s3://bucket/in")) == ("s3://bucket/in",)
    assert paths(sb.read_text("/t")) == ("/t",)
    assert paths(sb.read_binary_files("/bin")) == ("/bin",)
    assert paths(sb.range(3)) == ()
