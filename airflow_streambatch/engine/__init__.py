"""The streaming batch engine: Ray Data's execution model on Spark executors.

Importable without Airflow, from a notebook or a ``spark-submit`` script::

    import airflow_streambatch.engine as sb

    ds = sb.read_parquet("in/").map_batches(Embed, num_gpus=1, batch_size=64)
    ds.write_parquet("out/")
    print(ds.stats())
"""

from airflow_streambatch.engine.compute import ActorPoolStrategy, TaskPoolStrategy
from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.engine.custom_source import Datasource, ReadTask, read_datasource
from airflow_streambatch.engine.dataset import DataIterator, Dataset, MaterializedDataset
from airflow_streambatch.engine.errors import (
    LineageError,
    PartialResultWarning,
    PartitionFailure,
    PartitionsFailedError,
    StreamBatchError,
    UserCodeError,
    UserCodeException,
)
from airflow_streambatch.engine.execution.partitions import WriteResult
from airflow_streambatch.engine.execution_resources import ExecutionOptions, ExecutionResources
from airflow_streambatch.engine.schema import Schema
from airflow_streambatch.engine.in_memory import from_arrow, from_blocks, from_numpy, from_pandas
from airflow_streambatch.engine.path_args import FileShuffleConfig
from airflow_streambatch.engine.range_tensor import range_tensor
from airflow_streambatch.engine.save_mode import SaveMode
from airflow_streambatch.engine.read_numpy import read_numpy
from airflow_streambatch.engine.parquet_bulk import read_parquet_bulk
from airflow_streambatch.engine.read_api import (
    from_items,
    range,
    read_binary_files,
    read_csv,
    read_json,
    read_parquet,
    read_text,
)

__all__ = [
    "ActorPoolStrategy",
    "DataContext",
    "Datasource",
    "ReadTask",
    "TaskPoolStrategy",
    "read_datasource",
    "DataIterator",
    "ExecutionOptions",
    "ExecutionResources",
    "FileShuffleConfig",
    "Dataset",
    "LineageError",
    "MaterializedDataset",
    "PartialResultWarning",
    "PartitionFailure",
    "PartitionsFailedError",
    "SaveMode",
    "Schema",
    "StreamBatchError",
    "UserCodeError",
    "UserCodeException",
    "WriteResult",
    "from_arrow",
    "from_blocks",
    "from_items",
    "from_numpy",
    "from_pandas",
    "range",
    "range_tensor",
    "read_binary_files",
    "read_csv",
    "read_json",
    "read_numpy",
    "read_parquet",
    "read_parquet_bulk",
    "read_text",
]
