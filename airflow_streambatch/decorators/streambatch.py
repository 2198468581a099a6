"""``@task.streambatch``: a TaskFlow task whose function builds the epoch's pipeline.

    @task.streambatch(manifest=epoch.output, output_path="/data/scores/{{ ds }}")
    def score(ds, epoch, threshold=0.5):
        return ds.map_batches(Model, batch_size=64)

    score(threshold=0.7)

The task is a `StreamBatchOperator` whose ``pipeline`` is the decorated function, so
everything the operator does holds unchanged: its arguments and parse-time checks, the
per-partition commits, a failed partition failing the task and a Clear (or retry)
rerunning only the partitions without a commit record. What TaskFlow adds:

* the function's first two parameters receive the epoch's input `Dataset` and its
  `EpochManifest`; the arguments of the call (``score(threshold=0.7)``: constants,
  templates, other tasks' outputs) are its keyword arguments, rendered when the task runs;
* the function need not live in an importable module: its code, and the helpers and UDF
  classes of the DAG folder it uses, travel by value (`epochs.pipeline_by_value`) to Spark's
  Python workers and, with ``deploy_mode="spark_submit"``, to the spark-submit driver.

Airflow's context is not injected into the function (with spark-submit it runs in another
process): pass what it needs as a template, ``score(day="{{ ds }}")``.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.decorator import DecoratedOperator, TaskDecorator, task_decorator_factory
from airflow.sdk.definitions.context import KNOWN_CONTEXT_KEYS

from airflow_streambatch.epochs.pipeline_by_value import encode_pipeline, pickled_by_value
from airflow_streambatch.operators.streambatch import StreamBatchOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
SHAPE = "def pipeline(ds, epoch, **kwargs): return ds.map_batches(...)"


def check_pipeline_function(fn: Callable, op_args: Collection[Any] | None = None,
                            op_kwargs: Mapping[str, Any] | None = None) -> inspect.Signature:
    """Refuse, when the DAG file is parsed, a function the epoch runner cannot call as
    ``fn(dataset, epoch, **call_kwargs)``; return its signature with the first two parameters
    optional, so that Airflow's check of the call's arguments does not ask for them."""
    name = getattr(fn, "__name__", repr(fn))
    if op_args:
        raise TypeError(f"@task.streambatch {name}: pass the pipeline's arguments by keyword ({name}(threshold=0.7)):"
                        " its first two parameters receive the epoch's dataset and the epoch")
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    positional = [p for p in params[:2] if p.kind in _POSITIONAL]
    if len(positional) < 2 and not any(p.kind == p.VAR_POSITIONAL for p in params[:3]):
        raise TypeError(f"@task.streambatch {name}{signature}: the function receives the epoch's dataset and the "
                        f"epoch as its first two parameters and returns the pipeline: {SHAPE}")
    taken = sorted(set(op_kwargs or ()) & {p.name for p in positional})
    if taken:
        raise TypeError(f"@task.streambatch {name}: {taken} receive the epoch's dataset and the epoch; the call "
                        "cannot pass them")
    context_keys = [p.name for p in params[2:] if p.name in KNOWN_CONTEXT_KEYS]
    if context_keys:
        raise TypeError(f"@task.streambatch {name}: parameter(s) {context_keys} are Airflow context keys, which "
                        "@task.streambatch does not inject (with deploy_mode='spark_submit' the function runs in "
                        "another process): rename them and pass the value as a template, e.g. "
                        f"{name}(day='{{{{ ds }}}}')")
    return signature.replace(parameters=[p.replace(default=None) if i < 2 and p.kind in _POSITIONAL else p
                                         for i, p in enumerate(params)])


class _StreamBatchDecoratedOperator(DecoratedOperator, StreamBatchOperator):
    """`StreamBatchOperator` with the decorated function as its pipeline and the call's arguments as its
    ``pipeline_kwargs`` (merged over the decorator's own ``pipeline_kwargs``)."""

    custom_operator_name = "@task.streambatch"
    # the operator's, less the function (nothing to render), plus the call's arguments
    template_fields: Sequence[str] = (*(f for f in StreamBatchOperator.template_fields if f != "pipeline"),
                                      "op_kwargs")
    template_fields_renderers = {**StreamBatchOperator.template_fields_renderers, "op_kwargs": "py"}
    shallow_copy_attrs: Sequence[str] = ("python_callable", "pipeline")
    pipeline_by_value = True  # spark_submit ships the function itself (`_driver_pipeline`)

    def __init__(self, *, python_callable: Callable, op_args: Collection[Any] | None = None,
                 op_kwargs: Mapping[str, Any] | None = None, conn_id: str | None = None, **kwargs: Any) -> None:
        python_callable.__signature__ = check_pipeline_function(  # type: ignore[attr-defined]
            python_callable, op_args, op_kwargs)
        if conn_id is not None:  # @task.pyspark's name for the connection; the operator's is streambatch_conn_id
            if kwargs.get("streambatch_conn_id") not in (None, conn_id):
                raise ValueError(f"@task.streambatch {python_callable.__name__}: conn_id={conn_id!r} and "
                                 f"streambatch_conn_id={kwargs['streambatch_conn_id']!r} name the same connection: "
                                 "give one")
            kwargs["streambatch_conn_id"] = conn_id
        super().__init__(kwargs_to_upstream={"pipeline": python_callable}, python_callable=python_callable,
                         op_args=op_args, op_kwargs=op_kwargs, **kwargs)

    def _dag_folder(self) -> str | None:
        fileloc = getattr(self.dag, "fileloc", None) if self.has_dag() else None
        return os.path.dirname(os.path.abspath(fileloc)) if fileloc else None

    def execute(self, context: Context) -> Any:
        self.pipeline_kwargs = {**(self.pipeline_kwargs or {}), **self.op_kwargs}  # both rendered by now
        # the DAG folder's code travels by value for the whole run: the UDFs the engine sends to the
        # Python workers (in_process), the function pickled into the spark-submit spec (`_driver_pipeline`)
        with pickled_by_value(self.python_callable, self._dag_folder()):
            return super().execute(context)

    def _driver_pipeline(self) -> dict:
        return encode_pipeline(self.python_callable, self._dag_folder(), where=f"@task.streambatch {self.task_id}")


def streambatch_task(python_callable: Callable | None = None, multiple_outputs: bool | None = None,
                     **kwargs: Any) -> TaskDecorator:
    """``@task.streambatch(...)``: the keyword arguments are `StreamBatchOperator`'s (``pipeline`` aside:
    the function is the pipeline), with ``conn_id`` accepted for ``streambatch_conn_id``. The task returns
    the operator's bounded epoch summary as its XCom."""
    return task_decorator_factory(python_callable=python_callable, multiple_outputs=multiple_outputs,
                                  decorated_operator_class=_StreamBatchDecoratedOperator, **kwargs)
