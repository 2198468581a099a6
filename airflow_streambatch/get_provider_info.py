"""What `airflow providers list` and the connection form know about this provider."""

from __future__ import annotations

from airflow_streambatch import __version__


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-streambatch",
        "name": "Streaming batch on Spark",
        "description": "Heterogeneous batch inference on Spark: a streaming batch engine (Ray Data's execution "
                       "model) with epochs, per-partition commits and retries of failed partitions only.",
        "versions": [__version__],
        "integrations": [{"integration-name": "Streaming batch on Spark", "tags": ["apache"]}],
        "hooks": [{"integration-name": "Streaming batch on Spark",
                   "python-modules": ["airflow_streambatch.hooks.streambatch"]}],
        "operators": [{"integration-name": "Streaming batch on Spark",
                       "python-modules": ["airflow_streambatch.operators.streambatch"]}],
        "sensors": [{"integration-name": "Streaming batch on Spark",
                     "python-modules": ["airflow_streambatch.sensors.epoch"]}],
        "triggers": [{"integration-name": "Streaming batch on Spark",
                      "python-modules": ["airflow_streambatch.triggers.epoch"]}],
        "connection-types": [{"hook-class-name": "airflow_streambatch.hooks.streambatch.StreamBatchHook",
                              "connection-type": "streambatch"}],
        "extra-links": ["airflow_streambatch.operators.links.SparkUILink",
                        "airflow_streambatch.operators.links.EpochOutputLink"],
    }
