"""Ray Data's file reads (issue 17, item 4): ``filesystem=``, ``partitioning=``,
``partition_filter=``, compression, ``file_extensions``, ``include_paths``,
``ignore_missing_paths``, pyarrow's CSV and JSON option objects and ``read_json(lines=)``,
each pinned to what Ray Data's API reference documents, on real local Spark (the read
tasks, with their options pickled, run on Spark's executors)."""

from __future__ import annotations

import bz2
import gzip
import json

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as rd
from airflow_streambatch.engine.datasource import Partitioning, PathPartitionFilter
from airflow_streambatch.engine.plan.datasource import Fragment
from airflow_streambatch.engine.read_api import read_fragments


def _rows(ds, key):
    return sorted(ds.take_all(), key=lambda row: [row[k] for k in key])


# -- filesystem= ------------------------------------------------------------------------
def test_filesystem_resolves_paths_inside_it_not_by_scheme(ctx, tmp_path):
    """Ray: ``filesystem`` is the pyarrow filesystem to read from; the paths are in it."""
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "sub" / "a.csv").write_text("x\n1\n2\n")
    pq.write_table(pa.table({"y": [7]}), tmp_path / "in" / "b.parquet")
    tree = pafs.SubTreeFileSystem(str(tmp_path / "in"), pafs.LocalFileSystem())
    # "sub" means nothing to the local filesystem here, only inside the subtree
    assert sorted(r["x"] for r in rd.read_csv("sub", filesystem=tree).take_all()) == [1, 2]
    assert rd.read_parquet("b.parquet", filesystem=tree).take_all() == [{"y": 7}]
    assert rd.read_text("sub/a.csv", filesystem=tree).take_all() == [{"text": t} for t in ("x", "1", "2")]
    local = pafs.LocalFileSystem()  # a file:// URI's scheme is dropped inside the filesystem, as in Ray
    assert rd.read_csv(f"file://{tmp_path}/in/sub/a.csv", filesystem=local).count() == 2
    paths = rd.read_binary_files("sub", filesystem=tree, include_paths=True).take_all()
    assert paths == [{"bytes": b"x\n1\n2\n", "path": "sub/a.csv"}]
    with pytest.raises(TypeError, match="read_csv: filesystem must be a pyarrow.fs.FileSystem"):
        rd.read_csv("sub", filesystem="local")


# -- partitioning= ----------------------------------------------------------------------
def _hive_tree(root, write):
    for year, country in (("2023", "US"), ("2024", "New%20Zealand")):
        folder = root / f"year={year}" / f"country={country}"
        folder.mkdir(parents=True)
        write(folder, int(year))


def test_hive_partition_columns_are_added_by_default_as_strings(ctx, tmp_path):
    """Ray: ``partitioning`` defaults to ``Partitioning("hive")`` for read_parquet, read_csv and
    read_json; partition values are URL-decoded strings unless ``field_types`` says otherwise."""
    root = tmp_path / "in"
    _hive_tree(root, lambda d, v: pq.write_table(pa.table({"v": [v]}), d / "part.parquet"))
    rows = _rows(rd.read_parquet(str(root)), ["v"])
    assert rows == [{"v": 2023, "year": "2023", "country": "US"},
                    {"v": 2024, "year": "2024", "country": "New Zealand"}]
    csv_root = tmp_path / "csv"
    _hive_tree(csv_root, lambda d, v: (d / "part.csv").write_text(f"v\n{v}\n"))
    assert [r["country"] for r in _rows(rd.read_csv(str(csv_root)), ["v"])] == ["US", "New Zealand"]
    json_root = tmp_path / "json"
    _hive_tree(json_root, lambda d, v: (d / "part.json").write_text(json.dumps({"v": v}) + "\n"))
    typed = rd.read_json(str(json_root), partitioning=Partitioning("hive", field_types={"year": int}))
    assert [(r["year"], r["country"]) for r in _rows(typed, ["v"])] == [(2023, "US"), (2024, "New Zealand")]
    assert typed.schema().field("year").type == pa.int64()
    # columns= selects partition columns as it selects the file's, in the order named
    assert _rows(rd.read_parquet(str(root), columns=["country", "v"]), ["v"])[0] == {"country": "US", "v": 2023}
    assert rd.read_parquet(str(root), columns=["v"]).columns() == ["v"]
    # partitioning=None: no partition columns
    assert rd.read_csv(str(csv_root), partitioning=None).columns() == ["v"]


def test_partition_filter_reads_only_the_files_whose_partitions_it_keeps(ctx, tmp_path):
    """Ray: ``PathPartitionFilter.of(filter_fn, style=...)``; ``filter_fn`` gets the partition
    values as strings read from the path (``{}`` for an unpartitioned file) and returns True
    to read the file; every ``read_*`` takes it as ``partition_filter``."""
    root = tmp_path / "in"
    _hive_tree(root, lambda d, v: pq.write_table(pa.table({"v": [v]}), d / "part.parquet"))
    pq.write_table(pa.table({"v": [0]}), root / "loose.parquet")  # unpartitioned
    seen = []

    def only_2024(values):
        seen.append(values)
        return values.get("year") == "2024"  # strings, even with field_types

    keep = PathPartitionFilter.of(only_2024, field_types={"year": int})
    assert [r["v"] for r in rd.read_parquet(str(root), partition_filter=keep).take_all()] == [2024]
    assert {} in seen and {"year": "2023", "country": "US"} in seen  # "2023", not 2023
    text_root = tmp_path / "text"
    _hive_tree(text_root, lambda d, v: (d / "part.txt").write_text(f"{v}\n"))
    partitioned_only = PathPartitionFilter.of(lambda d: bool(d), style="dir", base_dir=str(text_root),
                                              field_names=["year", "country"])
    assert sorted(r["text"] for r in rd.read_text(str(text_root), partition_filter=partitioned_only).take_all()) \
        == ["2023", "2024"]
    with pytest.raises(FileNotFoundError, match=r"2 file\(s\) left out by partition_filter"):
        rd.read_csv(str(text_root), partition_filter=PathPartitionFilter.of(lambda d: False)).take_all()
    with pytest.raises(TypeError, match="partition_filter must be an airflow_streambatch.engine.datasource"):
        rd.read_json(str(root), partition_filter=lambda paths: paths)


def test_text_and_binary_reads_have_no_partition_columns_by_default(ctx, tmp_path):
    """Ray: read_text and read_binary_files default to ``partitioning=None``."""
    root = tmp_path / "in"
    _hive_tree(root, lambda d, v: (d / "part.txt").write_text(f"{v}\n"))
    assert rd.read_text(str(root)).columns() == ["text"]
    with_dirs = rd.read_text(str(root), partitioning=Partitioning("hive", base_dir=str(root)))
    assert sorted((r["text"], r["year"]) for r in with_dirs.take_all()) == [("2023", "2023"), ("2024", "2024")]


def test_directory_partitioning_names_the_levels_below_base_dir(ctx, tmp_path):
    """Ray: ``Partitioning("dir", field_names=[...], base_dir=...)`` maps directory levels to names."""
    root = tmp_path / "in"
    for animal in ("cat", "dog"):
        (root / animal).mkdir(parents=True)
        (root / animal / "a.csv").write_text("n\n1\n")
    part = Partitioning("dir", field_names=["animal"], base_dir=str(root))
    assert sorted(r["animal"] for r in rd.read_csv(str(root), partitioning=part).take_all()) == ["cat", "dog"]
    with pytest.raises(ValueError, match="needs field_names"):
        Partitioning("dir")
    with pytest.raises(ValueError, match="style='range' is not"):
        Partitioning("range")
    with pytest.raises(TypeError, match="read_csv: partitioning must be"):
        rd.read_csv(str(root), partitioning="hive")


# -- compression ------------------------------------------------------------------------
def _hadoop_snappy(data: bytes) -> bytes:
    """Hadoop's Snappy framing, as Ray reads ``.snappy`` files: one block of one chunk."""
    chunk = pa.Codec("snappy").compress(data, asbytes=True)
    return len(data).to_bytes(4, "big") + len(chunk).to_bytes(4, "big") + chunk


def _zstd(data: bytes) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as out:
        out.write(data)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("suffix, compress", [
    (".gz", gzip.compress), (".bz2", bz2.compress),
    (".zst", _zstd),
    (".snappy", _hadoop_snappy),
])
def test_compression_is_inferred_from_the_file_name(ctx, tmp_path, suffix, compress):
    """Ray infers the codec from the path's extension and decompresses CSV, JSON and text."""
    (tmp_path / f"a.csv{suffix}").write_bytes(compress(b"x,y\n1,a\n2,b\n"))
    (tmp_path / f"a.jsonl{suffix}").write_bytes(compress(b'{"x": 1}\n{"x": 2}\n'))
    (tmp_path / f"a.txt{suffix}").write_bytes(compress(b"one\n\ntwo\n"))
    assert _rows(rd.read_csv(str(tmp_path / f"a.csv{suffix}")), ["x"]) == [{"x": 1, "y": "a"}, {"x": 2, "y": "b"}]
    assert sorted(r["x"] for r in rd.read_json(str(tmp_path / f"a.jsonl{suffix}")).take_all()) == [1, 2]
    assert [r["text"] for r in rd.read_text(str(tmp_path / f"a.txt{suffix}")).take_all()] == ["one", "two"]


def test_arrow_open_stream_args_compression_overrides_the_name(ctx, tmp_path):
    """Ray: ``arrow_open_stream_args={"compression": ...}`` is passed to the stream opener."""
    (tmp_path / "data.bin").write_bytes(gzip.compress(b"a\nb\n"))
    ds = rd.read_text(str(tmp_path / "data.bin"), arrow_open_stream_args={"compression": "gzip"})
    assert [r["text"] for r in ds.take_all()] == ["a", "b"]
    with pytest.raises(ValueError, match="read_text: arrow_open_stream_args compression='zip'"):
        rd.read_text(str(tmp_path / "data.bin"), arrow_open_stream_args={"compression": "zip"})
    with pytest.raises(ValueError, match="read_csv: arrow_open_stream_args supports only"):
        rd.read_csv(str(tmp_path / "data.bin"), arrow_open_stream_args={"mode": "r"})


def test_a_compressed_file_is_read_whole_and_never_in_byte_ranges(ctx, tmp_path):
    """A gzip stream cannot start mid-file: a byte-range fragment of one is refused, naming it,
    while the whole file reads through read_fragments (as an epoch manifest keeps it)."""
    path = tmp_path / "big.csv.gz"
    path.write_bytes(gzip.compress(b"x\n" + b"".join(b"%d\n" % i for i in range(100))))
    size = path.stat().st_size
    whole = read_fragments([Fragment(str(path), size)], "csv")
    assert sorted(r["x"] for r in whole.take_all()) == list(range(100))
    plain = tmp_path / "day=1" / "big.csv"  # uncompressed: byte ranges read every line once, with Hive columns
    plain.parent.mkdir()
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    size_plain = plain.stat().st_size
    ranges = read_fragments([Fragment(str(plain), 100, byte_range=(0, 100)),
                             Fragment(str(plain), size_plain - 100, byte_range=(100, size_plain))], "csv")
    assert sorted((r["x"], r["day"]) for r in ranges.take_all()) == [(i, "1") for i in range(100)]
    ctx.max_task_retries = 0
    with pytest.raises(rd.PartitionsFailedError, match="gzip-compressed, so it cannot be read in byte ranges"):
        read_fragments([Fragment(str(path), size // 2, byte_range=(0, size // 2)),
                        Fragment(str(path), size - size // 2, byte_range=(size // 2, size))], "csv").take_all()


# -- file_extensions, include_paths, ignore_missing_paths -------------------------------
def test_file_extensions_filters_the_files_read(ctx, tmp_path):
    """Ray: ``file_extensions`` keeps only files ending in one of them (``"csv.gz"`` too)."""
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.csv").write_text("x\n1\n")
    (root / "b.CSV").write_text("x\n2\n")
    (root / "c.csv.gz").write_bytes(gzip.compress(b"x\n3\n"))
    (root / "notes.txt").write_text("x\nnot a number\n")
    ds = rd.read_csv(str(root), file_extensions=["csv", "csv.gz"])
    assert sorted(r["x"] for r in ds.take_all()) == [1, 2, 3]
    with pytest.raises(FileNotFoundError, match="No input files found to read"):
        rd.read_csv(str(root / "notes.txt"), file_extensions=["csv"]).take_all()
    with pytest.raises(TypeError, match="read_csv: file_extensions must be a list"):
        rd.read_csv(str(root), file_extensions="csv")


def test_include_paths_adds_a_path_column_to_every_reader(ctx, tmp_path):
    """Ray: ``include_paths=True`` adds a ``path`` column holding each row's file."""
    csv, js, txt, pqf = (tmp_path / n for n in ("a.csv", "a.json", "a.txt", "a.parquet"))
    csv.write_text("x\n1\n")
    js.write_text('{"x": 1}\n')
    txt.write_text("line\n")
    pq.write_table(pa.table({"x": [1]}), pqf)
    assert rd.read_csv(str(csv), include_paths=True).take_all() == [{"x": 1, "path": str(csv)}]
    assert rd.read_json(str(js), include_paths=True).take_all() == [{"x": 1, "path": str(js)}]
    assert rd.read_text(str(txt), include_paths=True).take_all() == [{"text": "line", "path": str(txt)}]
    assert rd.read_parquet(str(pqf), include_paths=True).take_all() == [{"x": 1, "path": str(pqf)}]
    assert rd.read_binary_files(str(txt), include_paths=False).take_all() == [{"bytes": b"line\n"}]
    assert rd.read_csv(str(csv)).columns() == ["x"]  # off by default, as in Ray


def test_ignore_missing_paths_skips_paths_that_do_not_exist(ctx, tmp_path):
    """Ray: ``ignore_missing_paths=True`` ignores missing paths instead of raising."""
    (tmp_path / "a.txt").write_text("here\n")
    paths = [str(tmp_path / "a.txt"), str(tmp_path / "gone.txt")]
    assert rd.read_text(paths, ignore_missing_paths=True).take_all() == [{"text": "here"}]
    with pytest.raises(FileNotFoundError, match="input path does not exist: .*gone.txt"):
        rd.read_text(paths).take_all()
    with pytest.raises(TypeError, match="read_text: ignore_missing_paths must be True or False"):
        rd.read_text(paths, ignore_missing_paths="yes")


# -- read_csv option objects ------------------------------------------------------------
def test_read_csv_takes_pyarrows_parse_read_and_convert_options(ctx, tmp_path):
    """Ray passes ``parse_options``, ``read_options`` and ``convert_options`` to pyarrow's CSV reader."""
    path = tmp_path / "a.tsv"
    path.write_text("# a comment line\n1\tx\n2\ty\n")
    ds = rd.read_csv(str(path), parse_options=pacsv.ParseOptions(delimiter="\t"),
                     read_options=pacsv.ReadOptions(skip_rows=1, column_names=["n", "s"]),
                     convert_options=pacsv.ConvertOptions(column_types={"n": pa.float64()}))
    assert _rows(ds, ["n"]) == [{"n": 1.0, "s": "x"}, {"n": 2.0, "s": "y"}]
    assert ds.schema().field("n").type == pa.float64()
    with pytest.raises(TypeError, match="read_csv: parse_options must be a pyarrow.csv.ParseOptions"):
        rd.read_csv(str(path), parse_options={"delimiter": "\t"})


# -- read_json(lines=) ------------------------------------------------------------------
def test_read_json_reads_lines_arrays_and_single_objects(ctx, tmp_path):
    """Ray: ``lines=False`` (default) reads JSON Lines, or falls back to a JSON document (an array
    of objects, or one object, one row); ``lines=True`` reads each line as a row."""
    (tmp_path / "lines.jsonl").write_text('{"a": 1}\n{"a": 2}\n')
    (tmp_path / "array.json").write_text(json.dumps([{"a": 3}, {"a": 4}], indent=2))
    (tmp_path / "one.json").write_text(json.dumps({"a": 5, "b": [1, 2]}, indent=2))
    assert sorted(r["a"] for r in rd.read_json(str(tmp_path / "lines.jsonl")).take_all()) == [1, 2]
    assert sorted(r["a"] for r in rd.read_json(str(tmp_path / "array.json")).take_all()) == [3, 4]
    assert rd.read_json(str(tmp_path / "one.json")).take_all() == [{"a": 5, "b": [1, 2]}]
    assert sorted(r["a"] for r in rd.read_json(str(tmp_path / "lines.jsonl"), lines=True).take_all()) == [1, 2]
    ctx.max_task_retries = 0
    with pytest.raises(rd.PartitionsFailedError, match="with lines=True every line must be one JSON object"):
        rd.read_json(str(tmp_path / "array.json"), lines=True).take_all()
    with pytest.raises(TypeError, match="read_json: lines must be True or False"):
        rd.read_json(str(tmp_path / "lines.jsonl"), lines="yes")


def test_read_json_takes_pyarrows_read_and_parse_options(ctx, tmp_path):
    """Ray: ``**arrow_json_args`` (``read_options``, ``parse_options``) go to
    ``pyarrow.json.read_json``; an ``explicit_schema`` types the columns."""
    (tmp_path / "lines.jsonl").write_text('{"a": 1, "b": "x"}\n{"a": 2, "b": "y"}\n')
    (tmp_path / "array.json").write_text(json.dumps([{"a": 3, "b": "z"}]))
    schema = pa.schema([("a", pa.float64()), ("b", pa.string())])
    parse = pajson.ParseOptions(explicit_schema=schema)
    ds = rd.read_json(str(tmp_path / "lines.jsonl"), parse_options=parse,
                      read_options=pajson.ReadOptions(block_size=1 << 16))
    assert ds.schema() == schema and sorted(r["a"] for r in ds.take_all()) == [1.0, 2.0]
    assert rd.read_json(str(tmp_path / "array.json"), parse_options=parse).schema() == schema  # the fallback too
    with pytest.raises(TypeError, match=r"unexpected argument 'orient'; arrow_json_args are \['parse_options'"):
        rd.read_json(str(tmp_path / "lines.jsonl"), orient="records")
    with pytest.raises(TypeError, match="parse_options must be a pyarrow.json.ParseOptions"):
        rd.read_json(str(tmp_path / "lines.jsonl"), parse_options={"explicit_schema": schema})
