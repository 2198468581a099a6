"""A Ray Data pipeline, as Ray Data's documentation writes one, run on Spark.

Only the import differs from Ray: ``import airflow_streambatch.engine as rd`` where a
Ray user writes ``import ray.data as rd``. It covers what the documentation's examples
do most: batch inference with a callable class holding a PyTorch model, reading,
transforming and writing Parquet, CSV and JSON, and ``iter_batches`` for training.

    python examples/ray_data_pipeline.py OUT_DIR
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

import airflow_streambatch.engine as rd  # a Ray user: import ray.data as rd


class TorchPredictor:
    """Built once per worker (Ray: once per actor), then called with batches of NumPy arrays."""

    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(in_features=4, out_features=1), torch.nn.Sigmoid())
        self.model.eval()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensor = torch.as_tensor(batch["data"], dtype=torch.float32)
        with torch.inference_mode():
            return {"id": batch["id"], "score": self.model(tensor).numpy().ravel()}


def add_features(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    batch["data"] = np.stack([(batch["id"] - 500) * k / 100.0 for k in range(1, 5)], axis=1)
    return batch


def label(row: dict[str, Any]) -> dict[str, Any]:
    row["label"] = "high" if row["score"] > 0.5 else "low"
    return row


def main(out: str) -> dict:
    ds = rd.range(1000).map_batches(add_features)
    predictions = ds.map_batches(TorchPredictor, concurrency=2, batch_size=128)
    predictions.write_parquet(f"{out}/predictions")

    scored = rd.read_parquet(f"{out}/predictions").map(label)
    scored.write_csv(f"{out}/csv")
    scored.filter(lambda row: row["label"] == "high").write_json(f"{out}/json")

    high = rd.read_json(f"{out}/json").count()
    from_csv = rd.read_csv(f"{out}/csv")
    batches = 0
    for batch in from_csv.iter_batches(batch_size=256):  # a training loop's input
        assert set(batch) == {"id", "score", "label"} and isinstance(batch["score"], np.ndarray)
        batches += 1
    summary = {"rows": from_csv.count(), "high": high, "mean_score": from_csv.mean("score"), "batches": batches}
    print(summary)
    return summary


if __name__ == "__main__":
    main(sys.argv[1])
