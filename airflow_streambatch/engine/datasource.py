"""Ray Data's ``ray.data.datasource`` names that the ``read_*`` functions take: ``Partitioning``
and ``PathPartitionFilter``."""

from __future__ import annotations

from airflow_streambatch.engine.read_options import PathPartitionFilter, Partitioning

__all__ = ["Partitioning", "PathPartitionFilter"]
