"""The README's demo command, run as a new user would: a fresh virtual environment, then one epoch
of the example DAG with the real embedding model, checked row by row."""

from __future__ import annotations

import glob
import os
import subprocess

import numpy as np
import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_demo_command_embeds_every_input_row_once_in_a_fresh_venv(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHONPATH", "PYSPARK"))}
    env["STREAMBATCH_DEMO_VENV"] = str(tmp_path / "venv")
    proc = subprocess.run(["bash", os.path.join(REPO, ".ci", "demo"), "--root", str(tmp_path / "demo"),
                           "--hour", "2026-11-22T10"], env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "1000 rows embedded (384 dims)" in proc.stdout
    assert not glob.glob(f"{tmp_path}/venv/lib/python*/site-packages/nvidia*")  # no CUDA wheels came along

    inputs = pq.read_table(str(tmp_path / "demo" / "in" / "2026-11-22" / "10"))
    files = sorted(glob.glob(f"{tmp_path}/demo/embeddings/2026-11-22/10/p*/*.parquet"))
    out = pq.ParquetDataset(files).read()
    ids = out.column("id").to_pylist()
    assert sorted(ids) == sorted(inputs.column("id").to_pylist()) and len(set(ids)) == len(ids)
    vectors = np.array(out.column("embedding").to_pylist(), dtype=np.float32)
    assert vectors.shape == (inputs.num_rows, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    # a real sentence model: the same text gives the same vector, related texts are closer than unrelated
    texts = dict(zip(inputs.column("id").to_pylist(), inputs.column("text").to_pylist()))
    by_text = {}
    for row_id, vector in zip(ids, vectors):
        by_text.setdefault(texts[row_id], []).append(vector)
    repeated = [v for v in by_text.values() if len(v) > 1]
    assert repeated and all(np.allclose(v[0], v[1], atol=1e-4) for v in repeated)
    assert len(by_text) > 100 and min(float(a[0] @ b[0]) for a, b in zip(list(by_text.values())[:50],
                                                                         list(by_text.values())[1:51])) < 0.99


def test_running_the_demo_again_for_an_hour_keeps_its_inputs(tmp_path):
    """The second ``demo run`` of an hour found its inputs rewritten (new modification times) and
    its committed epoch refused them as changed inputs; an hour with its marker is left as it is."""
    from datetime import datetime, timezone

    from airflow_streambatch.demo import generate

    hour = datetime(2026, 11, 22, 10, tzinfo=timezone.utc)
    directory = generate(str(tmp_path), hour, files=2, rows=5)
    before = {p: os.stat(p).st_mtime_ns for p in glob.glob(f"{directory}/*")}
    os.utime(next(iter(before)), ns=(1, 1))  # any rewrite would give it a new time
    assert generate(str(tmp_path), hour, files=2, rows=5) == directory
    assert os.stat(next(iter(before))).st_mtime_ns == 1
    assert sorted(glob.glob(f"{directory}/*")) == sorted(before)
