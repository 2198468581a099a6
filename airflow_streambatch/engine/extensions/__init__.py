"""Ray Data's ``ray.data.extensions``: the tensor-column names (`tensor_extension`)."""

from airflow_streambatch.engine.extensions.tensor_extension import ArrowTensorArray, ArrowTensorType, ArrowTensorTypeV2

__all__ = ["ArrowTensorArray", "ArrowTensorType", "ArrowTensorTypeV2"]
