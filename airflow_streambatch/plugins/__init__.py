"""The provider's Airflow UI plugin: the epoch view, a tab on a StreamBatchOperator task instance.

`epoch_view` holds the plugin class (registered with the ``airflow.plugins`` entry point)
and builds its FastAPI app on the first request, so that the scheduler and task processes,
which load every plugin too, never import the API server's modules; `epoch_data` gathers
what the view shows from the metadata database and the durable epoch record; `epoch_page`
renders it as one self-contained HTML page.
"""
