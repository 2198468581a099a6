"""The example DAG's pipeline module (``dags/text_pipelines.py``), for the benchmarks that run its pipeline.

``dags/`` is not a package: it goes on this process's path and on ``PYTHONPATH``, which
the Python workers that Spark, Daft and Ray start inherit, so functions pickled by
reference (``text_pipelines.clean``) import there too.
"""

from __future__ import annotations

import os
import sys

_DAGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dags")
sys.path.insert(0, _DAGS)
os.environ["PYTHONPATH"] = os.pathsep.join([_DAGS, os.environ.get("PYTHONPATH", "")])
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the packaged weights only: nothing is fetched

import text_pipelines  # noqa: E402

__all__ = ["text_pipelines"]
