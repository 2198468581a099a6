"""The epoch view plugin: a FastAPI app under ``/streambatch`` and a tab on the task instance page.

Route: ``GET /streambatch/epochs/{dag_id}/{run_id}/{task_id}?map_index=-1`` (the
"Epoch output" link, `operators.links.epoch_view_url`, points here). Airflow's API server mounts the app; the UI shows
it in an iframe on a "task_instance" external view, substituting ``{DAG_ID}``,
``{RUN_ID}``, ``{TASK_ID}`` and ``{MAP_INDEX}`` in its ``href``. An unmapped task
instance's page has no map index, so the placeholder arrives unsubstituted and means -1.

Access is checked as for Airflow's own task instance endpoints
(``requires_access_dag("GET", TASK_INSTANCE)``): the caller's JWT (the UI's ``_token``
cookie, or an ``Authorization: Bearer`` header) must name a user whom the auth manager
lets read this DAG's task instances; otherwise 401 or 403.

Every Airflow process loads the plugins (the scheduler, the DAG processor, each task),
so this module imports nothing heavy: the FastAPI app, with the API server's security
and model modules, is built on the first request (`LazyEpochApp`).
"""

from __future__ import annotations

import asyncio

from airflow.sdk.plugins_manager import AirflowPlugin

URL_PREFIX = "/streambatch"
ROUTE = "/epochs/{dag_id}/{run_id}/{task_id}"


def parse_map_index(value: str | None) -> int:
    """``map_index`` from the query: an int, or -1 for the UI's unsubstituted ``{MAP_INDEX}``."""
    try:
        return int(value) if value is not None else -1
    except ValueError:
        return -1


def create_app():
    """The FastAPI app of the view (imports the API server's modules: call it in the API server only)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag
    from airflow.utils.session import create_session
    from fastapi import Depends, FastAPI, HTTPException
    from fastapi.responses import HTMLResponse

    from airflow_streambatch.plugins.epoch_data import gather
    from airflow_streambatch.plugins.epoch_page import render

    app = FastAPI(title="airflow-streambatch epoch view", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get(ROUTE, response_class=HTMLResponse,
             dependencies=[Depends(requires_access_dag("GET", DagAccessEntity.TASK_INSTANCE)),
                           Depends(requires_access_dag("GET", DagAccessEntity.XCOM))])
    def epoch_view(dag_id: str, run_id: str, task_id: str, map_index: str = "-1") -> HTMLResponse:
        index = parse_map_index(map_index)
        with create_session() as session:
            view = gather(session, dag_id, run_id, task_id, index)
        if view is None:
            raise HTTPException(404, f"no task instance {dag_id}.{task_id} (map index {index}) in run {run_id}")
        page = render(view)
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    return app


class LazyEpochApp:
    """An ASGI app that builds the view's FastAPI app on its first request (see the module's docstring), in a
    thread: its imports take seconds, which the API server's event loop must not wait for."""

    def __init__(self):
        self._app = None
        self._lock = asyncio.Lock()  # binds to the server's event loop on first contention, not here

    async def __call__(self, scope, receive, send):
        if self._app is None:
            async with self._lock:
                if self._app is None:
                    self._app = await asyncio.to_thread(create_app)
        await self._app(scope, receive, send)


class StreamBatchPlugin(AirflowPlugin):
    """The epoch view: per-partition state, errors and progress of a StreamBatchOperator task instance."""

    name = "streambatch"
    fastapi_apps = [{"app": LazyEpochApp(), "url_prefix": URL_PREFIX, "name": "Streaming batch epoch view"}]
    external_views = [{
        "name": "Epoch",
        # relative: the UI resolves it against its base URL (a deployment under a sub-path keeps working)
        "href": "streambatch/epochs/{DAG_ID}/{RUN_ID}/{TASK_ID}?map_index={MAP_INDEX}",
        "destination": "task_instance",
        "url_route": "streambatch-epoch",
    }]
