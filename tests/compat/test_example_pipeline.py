"""The Ray Data pipeline in examples/ runs unchanged, as its own program (issue 17: a Ray user's
pipeline from the documentation's examples runs after only the import is changed)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
EXAMPLE = os.path.join(EXAMPLES, "ray_data_pipeline.py")
LARGER = os.path.join(EXAMPLES, "ray_data_etl.py")  # issue 32: a user's whole job, with Ray's long tail


@pytest.mark.parametrize("example", [EXAMPLE, LARGER])
def test_the_example_imports_the_engine_where_ray_users_import_ray_data(example):
    """The only line a Ray user changes; nothing else of this package is imported."""
    tree = ast.parse(open(example).read())
    imports = [(a.name, a.asname) for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
    assert [i for i in imports if i[1] == "rd"] == [("airflow_streambatch.engine", "rd")]
    assert not [i for i in imports if i[0].startswith("airflow_streambatch") and i[1] != "rd"]
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and "streambatch" in (n.module or "")]


def _run(example: str, out) -> dict:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, example, str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1])


def test_the_ray_data_example_runs_end_to_end(tmp_path):
    pytest.importorskip("torch")
    summary = _run(EXAMPLE, tmp_path / "out")
    assert summary["rows"] == 1000 and 0 < summary["high"] < 1000 and summary["batches"] == 4
    assert 0 < summary["mean_score"] < 1


def test_the_larger_ray_data_program_runs_end_to_end(tmp_path):
    summary = _run(LARGER, tmp_path / "out")
    # 8 sensors x 250 readings, every fifth dropped; 1,600 rows in shuffled batches of 128, the last dropped
    assert summary["rows"] == 1600 and summary["batches"] == 12 and summary["rows_trained"] == 1536
    assert summary["files"] >= 1 and 0 < summary["anomalies"] < 1600 and 0 < summary["sampled"] < 1600
    assert 0 < summary["mean_residual"] < 0.15 < summary["max_magnitude"]
