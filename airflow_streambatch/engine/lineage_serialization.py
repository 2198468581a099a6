"""Ray Data's ``Dataset.serialize_lineage()`` / ``Dataset.deserialize_lineage(bytes)``.

Why: Ray lets a program store a dataset's *recipe* (its logical plan, no data) and rebuild it
later, in another process or on another cluster, for example as a tuning hyperparameter. That
works only where the data will still exist when the plan runs again, so, as Ray's
``has_serializable_lineage`` decides:

* a plan that starts from a read (``read_*``, ``range``, ``read_datasource``) is serializable,
  with every transform after it (functions and classes are pickled with cloudpickle, as Spark
  ships them);
* a plan that starts from data in the driver's memory (``from_items``, ``from_pandas``,
  ``from_arrow``, ``from_numpy``, ``from_blocks``) or from existing blocks (a materialized
  dataset, a ``zip``) raises ``ValueError`` with Ray's explanation;
* a ``union`` is serializable only when each of its inputs is a bare read (Ray's rule: "lazy
  read unions"); a union of transformed datasets is not.

What is stored is the list of logical operators (``Dataset._logical``); the dataset's own
``DataContext`` is not (its block directory and ports belong to the host that made it): the
rebuilt dataset runs with the context current where it is deserialized. The bytes are a pickle:
deserialize only bytes from a source you trust, as with any pickle.
"""

from __future__ import annotations

from pyspark import cloudpickle

from airflow_streambatch.engine.plan.logical import InputBlocks, Read

_FORMAT = "airflow_streambatch.lineage/1"

# Ray's message (its ``serialize_lineage``), with this engine's reason appended where it is known
_UNSUPPORTED = (
    "Lineage-based serialization is not supported for this dataset, which means that it cannot be used "
    "as a tunable hyperparameter. Lineage-based serialization is explicitly NOT supported for unioned or "
    "zipped datasets (see docstrings for those methods), and is only supported for datasets created from "
    "data that we know will still exist at deserialization time, e.g. external data in persistent cloud "
    "object stores. Concretely, all ray.data.read_*() APIs support lineage-based serialization, while all "
    "of the ray.data.from_*() APIs do not. To allow this dataset to be serialized to storage, write the data "
    "to an external store using the Dataset.write_*() APIs, and serialize a new dataset reading from it "
    "using the read_*() APIs."
)


def unsupported_reason(logical: list) -> str | None:
    """Why the plan ``logical`` cannot be serialized; None when it can."""
    source = logical[0]
    if isinstance(source, InputBlocks):
        if source.union_of is None:
            return "it starts from existing blocks (a materialized dataset, a zip, or a union of transformed datasets)"
        reads = source.union_of
    elif isinstance(source, Read):
        reads = (source,)
    else:
        return f"it starts from {type(source).__name__}, not from a read"
    in_memory = [read.datasource.name for read in reads if read.datasource.in_memory]
    if in_memory:
        return f"it starts from data in the driver's memory ({', '.join(in_memory)})"
    return None


def serialize_lineage(dataset) -> bytes:
    reason = unsupported_reason(dataset._logical)
    if reason is not None:
        raise ValueError(f"{_UNSUPPORTED} (Here: {reason}.)")
    source, *ops = dataset._logical
    reads = list(source.union_of) if isinstance(source, InputBlocks) else [source]
    return cloudpickle.dumps({"format": _FORMAT, "reads": reads, "union": isinstance(source, InputBlocks),
                              "ops": ops})


def deserialize_lineage(data: bytes):
    """The dataset ``serialize_lineage`` stored: nothing runs until it is consumed, except a
    union's inputs, which ``union`` runs at once here as it always does."""
    from airflow_streambatch.engine.dataset import Dataset

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"Dataset.deserialize_lineage expects the bytes serialize_lineage returned, "
                        f"got {type(data).__name__}")
    state = cloudpickle.loads(bytes(data))
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise ValueError("Dataset.deserialize_lineage: these bytes were not made by Dataset.serialize_lineage")
    first, *others = [Dataset([read]) for read in state["reads"]]
    dataset = first.union(*others) if state["union"] else first
    return Dataset([*dataset._logical, *state["ops"]])
