"""Ray Data's ``ray.data.datasource`` names that the ``read_*`` functions take: ``Partitioning``."""

from __future__ import annotations

from airflow_streambatch.engine.read_options import Partitioning

__all__ = ["Partitioning"]
