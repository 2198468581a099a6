"""OpenLineage parent-job properties for the epoch's Spark application.

Spark's OpenLineage listener (``io.openlineage:openlineage-spark``, when the Spark
application loads it) names the Airflow task that started it as its parent through
``spark.openlineage.parentJobName``, ``parentRunId`` and the root-parent properties;
with them a lineage backend joins the Spark application's events under the task's.
The Spark provider's operators add them when ``[openlineage]
spark_inject_parent_job_info`` (and ``spark_inject_transport_info`` for the HTTP
transport's settings) is true; `StreamBatchHook.conf` does the same, for the embedded
session and for spark-submit, using the OpenLineage provider's own functions. Nothing
is added without that provider, when it is disabled, outside a running task, or when
the Spark properties already hold parent-job (or transport) properties: explicit
settings win.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def openlineage_spark_properties(requested: dict[str, str]) -> dict[str, str]:
    """The ``spark.openlineage.*`` properties to add to ``requested`` (only the new ones)."""
    try:
        from airflow.providers.openlineage import conf as ol_conf
    except ImportError:  # the provider is optional
        return {}
    parent, transport = ol_conf.spark_inject_parent_job_info(), ol_conf.spark_inject_transport_info()
    if ol_conf.is_disabled() or not (parent or transport):
        return {}
    from airflow.providers.openlineage.utils.spark import (  # imports the listener: only when it is in use
        inject_parent_job_information_into_spark_properties,
        inject_transport_information_into_spark_properties,
    )
    from airflow.sdk import get_current_context

    try:
        context = get_current_context()
    except RuntimeError:  # the hook used outside a task (a notebook, a script): no parent job
        return {}
    properties = dict(requested)
    try:
        if parent:
            properties = inject_parent_job_information_into_spark_properties(properties, context)
        if transport:
            properties = inject_transport_information_into_spark_properties(properties, context)
    except Exception:  # noqa: BLE001 - lineage must never fail the epoch
        log.warning("Could not build the OpenLineage parent-job properties for Spark; the Spark application's "
                    "lineage events will have no parent", exc_info=True)
        return {}
    return {str(k): str(v) for k, v in properties.items() if k not in requested}
