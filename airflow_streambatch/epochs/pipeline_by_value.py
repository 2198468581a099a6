"""A pipeline function that travels by value: ``@task.streambatch``'s function, defined in a DAG file.

A ``"module:function"`` reference works in any process that can import the module. The
function of a TaskFlow task lives in the DAG file itself, which no other process can
import by name: Airflow loads DAG files as ``unusual_prefix_<hash>_<file>`` modules, and
importing the file anyway would run the whole DAG definition. So the function, and every
function and class of the DAG folder's modules it uses (its helpers, its UDF classes), is
pickled by value with cloudpickle (`pyspark.cloudpickle`, the pickler the engine sends UDFs
to Spark's Python workers with), the same way in both deploy modes:

* ``in_process``: `pickled_by_value` registers those modules for the epoch's run, so the
  UDFs the engine sends to the Python workers carry their code instead of naming a module
  the workers cannot import.
* ``spark_submit``: `encode_pipeline` pickles the function into the epoch spec (a 0600 file
  in a private directory, never a command line) and the driver's `decode_pipeline` loads it.

Shipping the source instead (``inspect.getsource``) would lose closures, default
arguments and the helpers the function calls; by value keeps them, at the cost of needing
the same Python (major.minor) on both sides, which `decode_pipeline` checks.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import logging
import os
import site
import sys
import sysconfig
from collections.abc import Callable, Iterator
from types import ModuleType

from pyspark import cloudpickle

log = logging.getLogger("airflow_streambatch.epochs")

FORMAT = "cloudpickle-by-value"
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


class PipelineNotShippable(ValueError):
    """The pipeline function cannot be pickled for the spark-submit driver."""


def _installed(path: str) -> bool:
    roots = (*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["stdlib"])
    return any(path.startswith(root) for root in roots if root)


def modules_by_value(fn: Callable, dag_folder: str | None) -> list[ModuleType]:
    """The function's own module and every imported module whose file is under ``dag_folder``: code
    that other processes cannot import by the name this process knows it under. Installed modules
    (site-packages, the standard library, this package) stay by reference: every process imports them."""
    folder = os.path.join(os.path.abspath(dag_folder), "") if dag_folder else None
    found: dict[str, ModuleType] = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if not isinstance(module, ModuleType) or not path or name.split(".")[0] == "airflow_streambatch":
            continue
        path = os.path.abspath(path)
        if (name == getattr(fn, "__module__", None) or (folder and path.startswith(folder))) and not _installed(path):
            found[name] = module
    return list(found.values())


@contextlib.contextmanager
def pickled_by_value(fn: Callable, dag_folder: str | None) -> Iterator[list[str]]:
    """Within the block, cloudpickle pickles the functions and classes of `modules_by_value` by value;
    afterwards the registry is as it was (a task process, or ``dag.test()``, runs other tasks too)."""
    added = [m for m in modules_by_value(fn, dag_folder)
             if m.__name__ not in cloudpickle.list_registry_pickle_by_value()]
    for module in added:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield [m.__name__ for m in added]
    finally:
        for module in added:
            with contextlib.suppress(ValueError):
                cloudpickle.unregister_pickle_by_value(module)


def _culprit(fn: Callable) -> str | None:
    """The first thing the function takes along that does not pickle, named for the error message:
    a default argument, a variable it closes over, a module global it uses."""
    try:
        closure = inspect.getclosurevars(fn)
    except (TypeError, ValueError):
        return None
    defaults = {name: p.default for name, p in inspect.signature(fn).parameters.items()
                if p.default is not inspect.Parameter.empty}
    candidates = [("default argument", n, v) for n, v in defaults.items()]
    candidates += [("variable it closes over", n, v) for n, v in closure.nonlocals.items()]
    candidates += [("module global", n, v) for n, v in closure.globals.items()]
    for kind, name, value in candidates:
        try:
            cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - any failure names the culprit
            return f"its {kind} {name!r} ({type(value).__module__}.{type(value).__qualname__}: {exc})"
    return None


def encode_pipeline(fn: Callable, dag_folder: str | None = None, where: str = "pipeline") -> dict:
    """``fn`` as the epoch spec carries it: ``{"format", "python", "name", "pickle"}`` (base64 text, JSON
    safe). A function that does not pickle raises `PipelineNotShippable` naming what it takes along that
    does not, before any Spark process starts."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    with pickled_by_value(fn, dag_folder):
        try:
            data = cloudpickle.dumps(fn, protocol=5)
        except Exception as exc:  # noqa: BLE001 - cloudpickle raises TypeError, PicklingError, RecursionError...
            culprit = _culprit(fn) if inspect.isfunction(fn) else None
            raise PipelineNotShippable(
                f"{where}: deploy_mode='spark_submit' sends the function {name} to the spark-submit driver "
                f"pickled by value, with what it uses; pickling it failed"
                f"{f' on {culprit}' if culprit else f': {exc}'}. Create such objects (clients, locks, sessions, "
                "loaded models) inside the function or in a UDF class's __init__ instead of taking them along, "
                "or use deploy_mode='in_process'") from exc
    log.info("%s: %s pickled by value for the spark-submit driver (%d bytes)", where, name, len(data))
    return {"format": FORMAT, "python": PYTHON, "name": name, "pickle": base64.b64encode(data).decode("ascii")}


def decode_pipeline(pipeline: str | dict) -> str | Callable:
    """The spec's pipeline: a ``"module:function"`` reference as is, or the function `encode_pipeline`
    pickled. The spec is the task's own 0600 file, as trusted as the DAG that wrote it."""
    if isinstance(pipeline, str):
        return pipeline
    if not isinstance(pipeline, dict) or pipeline.get("format") != FORMAT:
        raise ValueError(f"the spec's pipeline is neither 'module:function' nor a {FORMAT} function: {pipeline!r:.200}")
    if pipeline.get("python") != PYTHON:
        raise RuntimeError(f"the pipeline {pipeline.get('name')} was pickled by Python {pipeline.get('python')} and "
                           f"this driver runs Python {PYTHON}: a function pickled by value loads only in the same "
                           "Python version; give the driver the Airflow worker's Python (spark.pyspark.driver.python)")
    return cloudpickle.loads(base64.b64decode(pipeline["pickle"]))

