"""The Ray Data pipeline in examples/ runs unchanged, as its own program (issue 17: a Ray user's
pipeline from the documentation's examples runs after only the import is changed)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "ray_data_pipeline.py")


def test_the_example_imports_the_engine_where_ray_users_import_ray_data():
    imports = [node for node in ast.walk(ast.parse(open(EXAMPLE).read())) if isinstance(node, ast.Import)]
    assert [(a.name, a.asname) for node in imports for a in node.names if a.asname == "rd"] == [
        ("airflow_streambatch.engine", "rd")]


def test_the_ray_data_example_runs_end_to_end(tmp_path):
    pytest.importorskip("torch")
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, EXAMPLE, str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert summary["rows"] == 1000 and 0 < summary["high"] < 1000 and summary["batches"] == 4
    assert 0 < summary["mean_score"] < 1
