"""One `airflow standalone` per test session, shared by every module that needs it.

Each start costs about a minute of CI, so the server outlives a module; the fixture waits
only for health, and each module waits for the DAG ids it needs with `standalone.wait_dags`.
"""

from __future__ import annotations

import pytest
from airflow_standalone import Standalone
from airflow_ui import chromium


@pytest.fixture(scope="session")
def standalone(tmp_path_factory):
    home = str(tmp_path_factory.mktemp("airflow-standalone-home"))
    server = Standalone(home)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for the tests that read Airflow's UI (airflow_ui.py); one per module."""
    with chromium() as instance:
        yield instance
