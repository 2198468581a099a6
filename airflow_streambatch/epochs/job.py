"""One epoch run's parameters, with their defaults, in one place: `EpochJob`.

Why one type: an epoch's parameters travel from the operator (its keyword arguments,
rendered) either straight to the runner (``deploy_mode="in_process"``) or through a
spec file to a spark-submit driver (`epochs.spark_app`) and from there to the runner.
Each hop used to list the parameters again, with its own defaults, so a new argument
had to be added four times and a default could differ between the two deploy modes.
Now the operator builds one `EpochJob`, `to_spec` writes it as the driver's JSON spec,
`from_spec` rebuilds the same job there (a key the spec lacks takes the default
declared here, the only place defaults are), and the runner reads it.

What the spec holds is what the job holds, and never a secret: storage credentials and
connection passwords reach the driver through its environment and Spark properties file
(`hooks.streambatch.StreamBatchHook.submit_epoch`). The spec is still written as a 0600
file in a private directory, never on a command line: it carries the pipeline's keyword
arguments, and a by-value pipeline and a ``row_filter`` are pickles.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import pyarrow.compute as pc

from airflow_streambatch.engine.read_pruning import decode_filter, encode_filter
from airflow_streambatch.epochs.manifest import EpochManifest
from airflow_streambatch.epochs.manifest_store import read_manifest
from airflow_streambatch.epochs.outputs import EpochOutput
from airflow_streambatch.epochs.pipeline_by_value import decode_pipeline

DEFAULT_APP_NAME = "airflow-streambatch"  # the spark-submit driver's application name when none is given
# the spec's manifest: the pointer to the file the sensor froze (a few hundred bytes at any epoch size) ...
MANIFEST_POINTER = ("manifest_uri", "fingerprint")
MANIFEST_INLINE = "manifest"  # ... or, when there is no such file, the whole manifest


@dataclass(frozen=True, kw_only=True, eq=False)
class EpochJob:
    """Everything one run of one epoch needs, as the runner reads it.

    :param pipeline: ``"module:function"``, the function itself (in-process), or in a spec the
        `pipeline_by_value.encode_pipeline` dict of a ``@task.streambatch`` function.
    :param manifest: the epoch's frozen inputs.
    :param manifest_uri: where the sensor froze ``manifest`` (the spec then points there instead of
        carrying it); None: the spec carries the manifest itself.
    :param output_path: the output directory, or the Delta table's URI or Iceberg table's identifier.
    :param input_format: how the manifest's files are read (`runner.READERS`).
    :param output_format: how the rows are written (`outputs.OUTPUT_FORMATS`).
    :param output_options: keyword arguments of the write.
    :param pipeline_kwargs: keyword arguments of the pipeline function.
    :param full_recompute: delete the epoch's committed output first and recompute every partition.
    :param data_context: `DataContext` settings of the run (the connection's network extra under the
        operator's ``data_context``).
    :param columns: the input columns the pipeline gets, in this order (None: all).
    :param row_filter: a `pyarrow.compute.Expression`: only input rows where it holds.
    :param app_name: the spark-submit driver's application name.
    """

    pipeline: Any
    manifest: EpochManifest
    manifest_uri: str | None = None
    output_path: str
    input_format: str = "parquet"
    output_format: str = "parquet"
    output_options: dict = field(default_factory=dict)
    pipeline_kwargs: dict = field(default_factory=dict)
    full_recompute: bool = False
    data_context: dict = field(default_factory=dict)
    columns: list[str] | None = None
    row_filter: pc.Expression | None = None
    app_name: str = DEFAULT_APP_NAME

    def __post_init__(self):
        for name in ("output_options", "pipeline_kwargs", "data_context"):  # None: the caller has none
            if getattr(self, name) is None:
                object.__setattr__(self, name, {})

    def output(self) -> EpochOutput:
        """Where the rows go (a directory, or a table) and where the epoch's record and lease live."""
        return EpochOutput(self.output_path, self.output_format, self.output_options)

    def __eq__(self, other: object) -> bool:
        """Field by field; pyarrow expressions compare with ``equals`` (their ``==`` builds an expression)."""
        if not isinstance(other, EpochJob):
            return NotImplemented
        names = [f.name for f in fields(self) if f.name != "row_filter"]
        if [getattr(self, n) for n in names] != [getattr(other, n) for n in names]:
            return False
        mine, theirs = self.row_filter, other.row_filter
        return mine is theirs or (mine is not None and theirs is not None and mine.equals(theirs))

    __hash__ = None  # type: ignore[assignment]  # holds dicts

    # -- the spark-submit spec -------------------------------------------------------
    def to_spec(self) -> dict:
        """The JSON spec the spark-submit driver runs (`from_spec` there): every field, the manifest as
        a pointer to its frozen file when there is one, the row filter as `read_pruning.encode_filter`
        text. A function pipeline must be encoded first (`pipeline_by_value.encode_pipeline`)."""
        if callable(self.pipeline):
            raise ValueError(f"the epoch spec carries the pipeline as 'module:function' or pickled by value "
                             f"(pipeline_by_value.encode_pipeline), not the function {self.pipeline!r}")
        if self.manifest_uri is not None:
            where = {"manifest_uri": self.manifest_uri, "fingerprint": self.manifest.fingerprint}
        else:
            where = {MANIFEST_INLINE: self.manifest.to_dict()}
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("manifest", "manifest_uri")}
        return {**where, **rest, "row_filter": encode_filter(self.row_filter)}

    @classmethod
    def from_spec(cls, spec: dict) -> EpochJob:
        """The job `to_spec` wrote: the manifest read back from its URI (and checked against its fingerprint)
        or taken inline, a pickled pipeline loaded, the row filter decoded; a key the spec lacks (a spec
        written by hand) takes the default declared on the class."""
        if "manifest_uri" in spec:
            manifest = read_manifest(spec["manifest_uri"], spec["fingerprint"])
        else:
            manifest = EpochManifest.from_dict(spec[MANIFEST_INLINE])
        given = {f.name: spec[f.name] for f in fields(cls)
                 if f.name in spec and f.name not in ("manifest", "manifest_uri", "pipeline", "row_filter")}
        return cls(pipeline=decode_pipeline(spec["pipeline"]), manifest=manifest, manifest_uri=spec.get("manifest_uri"),
                   row_filter=decode_filter(spec.get("row_filter")), **given)
