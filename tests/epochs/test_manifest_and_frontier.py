"""Epoch manifests and frontiers on the local filesystem (no Airflow needed)."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import airflow_streambatch.engine as sb
from airflow_streambatch.epochs import EpochManifest, MarkerFile, Quiescence, Watermark, list_inputs

END = datetime(2026, 11, 22, 11, tzinfo=timezone.utc)


def _epoch(tmp_path, files=3):
    d = tmp_path / "in" / "2026-11-22T10"
    d.mkdir(parents=True)
    for i in range(files):
        pq.write_table(pa.table({"id": [10 * i + j for j in range(10)]}), d / f"part-{i}.parquet")
    (d / "_SUCCESS").write_text("")
    return d


def test_manifest_lists_inputs_in_path_order_and_round_trips_through_json(tmp_path):
    d = _epoch(tmp_path)
    manifest = EpochManifest("2026-11-22T10:00:00+00:00", END.isoformat(), list_inputs(str(d)))
    assert [os.path.basename(p) for p in manifest.paths] == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert all(p.size > 0 and p.mtime for p in manifest.partitions)
    again = EpochManifest.from_dict(json.loads(json.dumps(manifest.to_dict())))
    assert again == manifest and again.fingerprint == manifest.fingerprint


def test_manifest_detects_inputs_changed_after_it_froze_them(tmp_path):
    d = _epoch(tmp_path)
    manifest = EpochManifest("s", "e", list_inputs(str(d)))
    manifest.verify_unchanged()
    pq.write_table(pa.table({"id": list(range(100))}), d / "part-1.parquet")
    with pytest.raises(ValueError, match="part-1.parquet changed after the epoch's manifest"):
        manifest.verify_unchanged()
    os.remove(d / "part-2.parquet")
    with pytest.raises(FileNotFoundError, match="part-2.parquet"):
        EpochManifest("s", "e", [p for p in manifest.partitions if "part-2" in p.path]).verify_unchanged()


def test_manifest_files_are_one_engine_partition_each_with_their_path_as_label(ctx, tmp_path):
    d = _epoch(tmp_path)
    manifest = EpochManifest("s", "e", list_inputs(str(d)))
    result = sb.read_parquet(manifest.paths, override_num_blocks=len(manifest.paths)).write_parquet(
        str(tmp_path / "out"))
    assert [result.committed[i].label for i in range(3)] == manifest.paths


def test_marker_and_watermark_frontiers(tmp_path):
    d = _epoch(tmp_path)
    assert MarkerFile(str(d / "_SUCCESS")).passed(END)
    assert not MarkerFile(str(d / "_DONE")).passed(END)
    mark = tmp_path / "watermark"
    assert not Watermark(str(mark)).passed(END)
    mark.write_text("2026-11-22T10:59:59+00:00")
    assert not Watermark(str(mark)).passed(END)
    mark.write_text("2026-11-22T11:00:00+00:00")
    assert Watermark(str(mark)).passed(END)
    mark.write_text("yesterday")
    with pytest.raises(ValueError, match="ISO-8601"):
        Watermark(str(mark)).passed(END)


def test_quiescence_needs_an_unchanged_listing_for_the_quiet_period():
    quiet = Quiescence(quiet_period_s=60)
    listing = {"a.parquet": [10, 1.0]}
    passed, state = quiet.observe(None, listing, now=1000)
    assert not passed
    passed, state = quiet.observe(state, listing, now=1059)
    assert not passed
    passed, state = quiet.observe(state, {"a.parquet": [20, 2.0]}, now=1061)  # changed: the clock restarts
    assert not passed and state["since"] == 1061
    passed, _ = quiet.observe(state, {"a.parquet": [20, 2.0]}, now=1121)
    assert passed
    assert not quiet.observe(None, {}, now=0)[0] and not quiet.observe({"listing": {}, "since": 0}, {}, now=999)[0]
