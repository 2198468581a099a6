"""Ray Data's batch formats (issue 17, item 1), pinned from its API reference.

`Dataset.map_batches` and `Dataset.iter_batches` default to ``batch_format="default"``:
"If "default" or "numpy", batches are Dict[str, numpy.ndarray]". ``None`` hands the
blocks' native format (a `pyarrow.Table` here), and a UDF may return any format.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import airflow_streambatch.engine as rd  # what a Ray Data user writes as `import ray.data as rd`


def test_map_batches_hands_a_dict_of_numpy_arrays_by_default(ctx):
    seen = []

    def double(batch):
        seen.append(type(batch))
        return {"id": batch["id"] * 2}  # a Ray user's first UDF: arithmetic on a NumPy column

    rows = rd.range(10, override_num_blocks=2).map_batches(double).take_all()
    assert sorted(r["id"] for r in rows) == list(range(0, 20, 2))


def test_default_numpy_pandas_pyarrow_and_none_are_the_documented_types(ctx):
    def kind(batch):
        name = ("dict" if isinstance(batch, dict) and all(isinstance(v, np.ndarray) for v in batch.values())
                else "pandas" if isinstance(batch, pd.DataFrame) else "pyarrow" if isinstance(batch, pa.Table)
                else type(batch).__name__)
        return {"kind": np.array([name] * len(batch["id"]))}

    ds = rd.range(4, override_num_blocks=1)
    for fmt, expected in [("default", "dict"), ("numpy", "dict"), ("pandas", "pandas"), ("pyarrow", "pyarrow"),
                          (None, "pyarrow")]:
        assert {r["kind"] for r in ds.map_batches(kind, batch_format=fmt).take_all()} == {expected}, fmt


def test_iter_batches_defaults_to_numpy_and_accepts_none(ctx):
    ds = rd.range(10, override_num_blocks=2)
    batches = list(ds.iter_batches(batch_size=4))
    assert all(isinstance(b, dict) and isinstance(b["id"], np.ndarray) for b in batches)
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(10))
    assert all(isinstance(b, pa.Table) for b in ds.iter_batches(batch_size=4, batch_format=None))


def test_an_unknown_batch_format_is_refused_naming_the_choices(ctx):
    with pytest.raises(ValueError, match=r"unknown batch_format 'arrow'; use one of \('default', 'numpy'"):
        rd.range(3).map_batches(lambda b: b, batch_format="arrow")
