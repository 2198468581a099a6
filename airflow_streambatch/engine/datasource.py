"""Ray Data's ``ray.data.datasource`` names: ``Partitioning``, ``PartitionStyle`` and
``PathPartitionFilter`` (arguments of the ``read_*`` functions), the custom-source interface
(``Datasource``, ``ReadTask``, ``Reader``; read one with ``read_datasource``) and the file
metadata providers (``expand_paths`` lists a read's files, as in Ray)."""

from __future__ import annotations

from airflow_streambatch.engine.block import BlockMetadata
from airflow_streambatch.engine.custom_source import Datasource, Reader, ReadTask, read_datasource
from airflow_streambatch.engine.metadata_providers import (
    BaseFileMetadataProvider,
    DefaultFileMetadataProvider,
    DefaultParquetMetadataProvider,
    FastFileMetadataProvider,
    FileMetadataProvider,
    ParquetMetadataProvider,
)
from airflow_streambatch.engine.read_options import PartitionStyle, PathPartitionFilter, Partitioning

__all__ = [
    "BaseFileMetadataProvider",
    "BlockMetadata",
    "Datasource",
    "DefaultFileMetadataProvider",
    "DefaultParquetMetadataProvider",
    "FastFileMetadataProvider",
    "FileMetadataProvider",
    "ParquetMetadataProvider",
    "PartitionStyle",
    "Partitioning",
    "PathPartitionFilter",
    "ReadTask",
    "Reader",
    "read_datasource",
]
