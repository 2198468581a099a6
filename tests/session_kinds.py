"""Run a test module's tests on both kinds of Spark session: ``from session_kinds import spark_kind``.

`conftest.ctx` then gives each test the classic local session, and again a Spark Connect
client of `conftest.connect_server`: the same test code checks both.
"""

from __future__ import annotations

import pytest


@pytest.fixture(params=["classic", "connect"])
def spark_kind(request) -> str:
    return request.param
