"""What `airflow providers list` and the connection form know about this provider."""

from __future__ import annotations

import json

from airflow_streambatch import __version__

CONNECTION_FORM = {
    "hidden-fields": ["schema", "login", "password"],
    "relabeling": {"host": "Master", "extra": "Spark properties and options (JSON)"},
    "placeholders": {
        "host": "spark://spark-master:7077, yarn, k8s://https://host:443 or local[4]",
        "port": "7077 (or in the master URL)",
        "extra": json.dumps({"conf": {"spark.executor.memory": "4g"}, "deploy-mode": "client",
                             "spark-binary": "spark-submit"}),
    },
}


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-streambatch",
        "name": "Streaming batch on Spark",
        "description": "Heterogeneous batch inference on Spark: a streaming batch engine (Ray Data's execution "
                       "model) with epochs, per-partition commits and retries of failed partitions only.",
        "versions": [__version__],
        "integrations": [{"integration-name": "Streaming batch on Spark", "tags": ["apache"]}],
        "hooks": [{"integration-name": "Streaming batch on Spark",
                   "python-modules": ["airflow_streambatch.hooks.streambatch",
                                      "airflow_streambatch.hooks.object_store"]}],
        "operators": [{"integration-name": "Streaming batch on Spark",
                       "python-modules": ["airflow_streambatch.operators.streambatch"]}],
        "sensors": [{"integration-name": "Streaming batch on Spark",
                     "python-modules": ["airflow_streambatch.sensors.epoch"]}],
        "triggers": [{"integration-name": "Streaming batch on Spark",
                      "python-modules": ["airflow_streambatch.triggers.epoch"]}],
        "connection-types": [{
            "hook-class-name": "airflow_streambatch.hooks.streambatch.StreamBatchHook",
            "hook-name": "Streaming batch on Spark",
            "connection-type": "streambatch",
            # the connection form, read without importing the hook (Airflow >= 3.2; the hook's
            # get_ui_field_behaviour() is deprecated there): host is the master, extra the Spark conf
            "ui-field-behaviour": CONNECTION_FORM,
        }],
        # @task.streambatch: Airflow's TaskDecoratorCollection looks the name up here
        "task-decorators": [{"class-name": "airflow_streambatch.decorators.streambatch.streambatch_task",
                             "name": "streambatch"}],
        "extra-links": ["airflow_streambatch.operators.links.SparkUILink",
                        "airflow_streambatch.operators.links.EpochOutputLink"],
    }
