"""A larger Ray Data program, written as Ray Data's documentation and its users write one, run on Spark.

Only the import differs from Ray: ``import airflow_streambatch.engine as rd`` where a Ray
user writes ``import ray.data as rd``. Where `ray_data_pipeline.py` is the documentation's
first example, this is a user's whole job: a custom datasource of sensor readings, files
given as `pathlib.Path`s, Ray's `Schema` and `input_files()`, feature engineering with
row and batch functions, a model in an actor pool (`ActorPoolStrategy`), a sample for a
quick look, evaluation with aggregates, a shuffled training loop's input, and writes to a
given filesystem.

    python examples/ray_data_etl.py OUT_DIR
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs

import airflow_streambatch.engine as rd  # a Ray user: import ray.data as rd

SENSORS = 8
READINGS = 250  # per sensor


class SensorSource(rd.Datasource):
    """Readings of simulated sensors, one read task per group of sensors (Ray's custom datasource)."""

    def estimate_inmemory_data_size(self) -> int:
        return SENSORS * READINGS * 24

    def get_read_tasks(self, parallelism: int) -> list[rd.ReadTask]:
        groups = np.array_split(np.arange(SENSORS), min(parallelism, SENSORS))
        return [rd.ReadTask(lambda ids=ids: [_readings(ids)],
                            rd.block.BlockMetadata(num_rows=len(ids) * READINGS, size_bytes=len(ids) * READINGS * 24,
                                                   input_files=None, exec_stats=None))
                for ids in groups if len(ids)]


def _readings(sensor_ids) -> pa.Table:
    rng = np.random.default_rng(int(sensor_ids[0]))
    sensor = np.repeat(sensor_ids, READINGS)
    step = np.tile(np.arange(READINGS), len(sensor_ids))
    value = np.sin(step / 20.0) * (1 + sensor) + rng.normal(0, 0.1, len(step))
    return pa.table({"sensor": sensor, "step": step, "value": value})


def with_window(row: dict[str, Any]) -> dict[str, Any]:
    row["window"] = row["step"] // 50
    return row


def add_features(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    batch["magnitude"] = np.abs(batch["value"])
    batch["scaled"] = batch["value"] / (1.0 + batch["sensor"])
    return batch


class AnomalyModel:
    """Loaded once per actor: flags readings far from the sensor's expected curve."""

    def __init__(self, threshold: float):
        self.threshold = threshold

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        expected = np.sin(batch["step"] / 20.0)
        batch["residual"] = np.abs(batch["scaled"] - expected)
        batch["anomaly"] = batch["residual"] > self.threshold
        return batch


def main(out: str) -> dict:
    root = pathlib.Path(out)
    raw = rd.read_datasource(SensorSource())
    raw.write_parquet(root / "raw")  # a pathlib.Path, as Ray takes it

    readings = rd.read_parquet(root / "raw")
    assert readings.schema().names == ["sensor", "step", "value"], readings.schema()
    files = readings.input_files()

    scored = (
        readings.map(with_window)
        .filter(lambda row: row["step"] % 5 != 0)  # drop the calibration readings
        .map_batches(add_features, batch_format="numpy")
        .map_batches(AnomalyModel, fn_constructor_kwargs={"threshold": 0.15}, compute=rd.ActorPoolStrategy(size=2),
                     batch_size=256)
        .materialize()
    )
    print(scored.take(3))
    peek = scored.random_sample(0.1, seed=7).to_pandas()

    anomalies = scored.filter(lambda row: row["anomaly"])
    anomalies.select_columns(["sensor", "step", "residual"]).write_csv(
        str(root / "anomalies"), filesystem=pyarrow.fs.LocalFileSystem())

    batches = rows_trained = 0
    for batch in scored.iter_batches(batch_size=128, local_shuffle_buffer_size=512, local_shuffle_seed=0,
                                     drop_last=True):  # a training loop's input
        assert len(batch["value"]) == 128
        batches += 1
        rows_trained += len(batch["value"])

    summary = {
        "files": len(files),
        "rows": scored.count(),
        "anomalies": rd.read_csv(root / "anomalies").count(),
        "mean_residual": round(float(scored.mean("residual")), 6),
        "max_magnitude": round(float(scored.max("magnitude")), 6),
        "sampled": len(peek),
        "batches": batches,
        "rows_trained": rows_trained,
    }
    print(summary)
    return summary


if __name__ == "__main__":
    main(sys.argv[1])
