"""Extra links on a StreamBatchOperator task: its Spark UI, and where its output went.

Each try pushes the URL to XCom under the link's key; the UI reads it back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class _XComLink(BaseOperatorLink):
    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        return XCom.get_value(ti_key=ti_key, key=self.xcom_key) or ""


class SparkUILink(_XComLink):
    """The Spark UI of the application that ran the epoch (empty when the UI is disabled)."""

    name = "Spark UI"
    xcom_key = "streambatch_spark_ui"


class EpochOutputLink(_XComLink):
    """The epoch's output location (a ``file://``, ``s3://``, ... URI)."""

    name = "Epoch output"
    xcom_key = "streambatch_output"
