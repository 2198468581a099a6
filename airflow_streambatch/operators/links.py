"""Extra links on a StreamBatchOperator task: its Spark UI, and the epoch view of its partitions.

Airflow 3's UI shows only http(s) links, so "Epoch output" points at the provider's
epoch view (`epoch_view_url`, served by the provider's plugin), which shows the output
location with every partition's state; the ``file://``/``s3://`` URI of the output is
kept in XCom (`EpochOutputLink.output_key`) for the view and the REST API's readers.

The operator records what a link needs with the link's ``persist`` class method (the
convention of Airflow's provider links, e.g. Databricks' and Google's: the operator says
what to remember, the link class owns the XCom key and format). When the try ends,
Airflow's task runner calls ``get_link`` and stores the URL under ``xcom_key``, which
is what the UI and the REST API show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context
    from airflow.sdk.types import TaskInstanceKey

DEFAULT_BASE_URL = "http://localhost:8080"  # `airflow standalone`'s; [api] base_url says where the UI really is


def airflow_base_url() -> str:
    """``[api] base_url`` without its trailing slash, or `DEFAULT_BASE_URL` when unset."""
    from airflow.sdk.configuration import conf

    base = conf.get("api", "base_url", fallback="") or DEFAULT_BASE_URL
    return base.rstrip("/")


def epoch_view_url(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """The epoch view of one task instance, an http(s) page of the provider's Airflow plugin."""
    ids = "/".join(quote(str(part), safe="") for part in (dag_id, run_id, task_id))
    return f"{airflow_base_url()}/streambatch/epochs/{ids}?map_index={map_index}"


def _xcom(ti_key: TaskInstanceKey, key: str) -> Any:
    from airflow.sdk.execution_time.xcom import XCom

    return XCom.get_value(ti_key=ti_key, key=key)


def history_page(history_server_url: str, app_id: str) -> str:
    """The Spark History Server's page of one application."""
    return f"{history_server_url.rstrip('/')}/history/{quote(app_id, safe='')}/jobs/"


class SparkUILink(BaseOperatorLink):
    """The Spark UI of the application that ran the epoch: the live UI while the try runs, then the
    Spark History Server's page of the application when one is configured (the live UI ends with the
    task); empty when the UI is disabled."""

    name = "Spark UI"
    xcom_key = "streambatch_spark_ui"  # the live UI while the try runs; what get_link says when it ends
    history_key = "streambatch_spark_history"  # the application's history page, when a history server is set

    @classmethod
    def persist(cls, context: Context, *, url: str | None, app_id: str | None = None,
                history_server_url: str | None = None) -> None:
        """Remember this try's live UI (``None``: ``spark.ui.enabled=false``) and, with a history
        server, the application's page there."""
        context["ti"].xcom_push(key=cls.xcom_key, value=url or "")
        history = history_page(history_server_url, app_id) if history_server_url and app_id else ""
        context["ti"].xcom_push(key=cls.history_key, value=history)  # always: get_link reads it

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        return _xcom(ti_key, self.history_key) or _xcom(ti_key, self.xcom_key) or ""


class EpochOutputLink(BaseOperatorLink):
    """The epoch view of the task instance, once its try has said where its output goes.

    ``persist`` keeps the output location (a ``file://``, ``s3://`` URI) under `output_key`;
    Airflow's task runner stores what ``get_link`` returns under ``xcom_key`` when the try
    ends, and the UI and REST API read that.
    """

    name = "Epoch output"
    xcom_key = "streambatch_output"  # the link (the epoch view's URL), written by Airflow when the try ends
    output_key = "streambatch_output_uri"  # the output location, written by `persist`

    @classmethod
    def persist(cls, context: Context, *, output_uri: str) -> None:
        """Remember where this try writes; the link points at the epoch view from then on."""
        context["ti"].xcom_push(key=cls.output_key, value=output_uri)

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        if not _xcom(ti_key, self.output_key):  # the try never got as far as its output: nothing to view
            return ""
        return epoch_view_url(ti_key.dag_id, ti_key.run_id, ti_key.task_id, ti_key.map_index)
