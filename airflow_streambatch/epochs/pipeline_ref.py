"""The pipeline a DAG names: ``"module:function"`` or the function itself.

It is checked in two steps, each as early as it can be. Its form, when the DAG file is
parsed (`check_pipeline_ref`): a dot for the colon (``churn.pipeline.score``) then fails
the DAG's import, in the UI's import errors, instead of the task hours later. Importing
the module waits for the task (`load_pipeline`, before Spark starts): Airflow's DAG
processor parses every file again and again, and a pipeline module typically imports
models and heavy libraries that have no business there (Airflow's "top-level code" rule).

Airflow puts the DAG folder on ``sys.path``, so a module in it is named by its path
under that folder: ``dags/embed.py`` is ``embed``, never ``dags.embed``. Every message
here says so, with examples that are right.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import re
from collections.abc import Callable
from typing import Any

_NAME = r"[A-Za-z_]\w*"
_FORM = re.compile(rf"{_NAME}(?:\.{_NAME})*:{_NAME}")
WHERE = ("The DAG folder is on the worker's sys.path, so a module there is named by its path under the folder: "
         "'embed:pipeline' is the function pipeline of dags/embed.py, 'churn.pipeline:score' the function score "
         "of dags/churn/pipeline.py")


def check_pipeline_ref(spec: Any, argument: str = "pipeline", dag_folder: str | None = None) -> None:
    """Refuse a pipeline reference that is not ``"module:function"`` (or a callable), suggesting the
    spelling that is when there is one (``dag_folder``: the DAG file's folder, for a reference written as
    a path); imports nothing."""
    if callable(spec):
        return
    if not isinstance(spec, str):
        raise ValueError(f"{argument} must be 'module:function' or the function itself, got {type(spec).__name__} "
                         f"{spec!r}. {WHERE}")
    if _FORM.fullmatch(spec):
        return
    guess = _suggestion(spec, dag_folder)
    hint = f" Did you mean {guess!r}?" if guess else ""
    raise ValueError(f"{argument}={spec!r} must be 'module:function'.{hint} {WHERE}")


def _suggestion(spec: str, dag_folder: str | None = None) -> str | None:
    """The reference a malformed one most likely meant: ``a.b.c`` -> ``a.b:c``, ``a::f`` -> ``a:f``, a
    path ``dags/churn/pipeline.py:f`` -> ``churn.pipeline:f`` (named from under the DAG folder: the
    folder's name or ``dags``, and what precedes it, dropped); ``None`` when nothing fits."""
    text = re.sub(r":+", ":", spec.strip())
    module, sep, attr = text.rpartition(":")
    if not sep:
        module, _, attr = text.rpartition(".")
    if "/" in module or "\\" in module or module.endswith(".py"):
        parts = [p for p in re.split(r"[/\\]+", module.removesuffix(".py")) if p and p != "."]
        folders = {"dags", os.path.basename(os.path.normpath(dag_folder)) if dag_folder else "dags"}
        last = max((i for i, part in enumerate(parts) if part in folders), default=-1)
        parts = parts[last + 1:]
        module = ".".join(parts)
    guess = f"{module}:{attr}"
    return guess if _FORM.fullmatch(guess) and guess != spec else None


def _module_suggestion(module_name: str) -> str | None:
    """For a module that does not import: the longest tail of its dotted name that Python finds (a
    reference written from the repository root, ``dags.embed``, whose DAG folder is ``dags``)."""
    parts = module_name.split(".")
    for i in range(1, len(parts)):
        tail = ".".join(parts[i:])
        try:
            if importlib.util.find_spec(tail) is not None:
                return tail
        except (ImportError, ValueError):
            continue
    return None


def _import_error(spec: str, module_name: str, attr: str, exc: ImportError) -> ImportError:
    missing = getattr(exc, "name", None)
    if missing and missing != module_name and not module_name.startswith(f"{missing}."):
        # the module was found; something it imports was not
        return ImportError(f"pipeline {spec!r}: importing module {module_name!r} failed: {exc}. Install what it "
                           "imports in the Airflow worker's environment (and the Spark executors')")
    tail = _module_suggestion(module_name)
    hint = f" Did you mean {f'{tail}:{attr}'!r}?" if tail else ""
    return ImportError(f"pipeline {spec!r}: cannot import pipeline module {module_name!r} ({exc}).{hint} {WHERE}; "
                       "other modules must be installed in the worker's environment")


def load_pipeline(spec: str | Callable, argument: str = "pipeline") -> Callable:
    """``"package.module:function"`` -> the function (a callable passes through). Errors name what to
    change: the form, a module that does not import (with the name that would), a missing function
    (with the module's functions of a close name)."""
    check_pipeline_ref(spec, argument)
    if callable(spec):
        return spec
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise _import_error(spec, module_name, attr, exc) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
        close = difflib.get_close_matches(attr, names, n=3)
        hint = f" Did you mean {' or '.join(repr(f'{module_name}:{c}') for c in close)}?" if close else ""
        raise ValueError(f"pipeline {spec!r}: module {module_name} ({getattr(module, '__file__', '?')}) has no "
                         f"function {attr!r}.{hint}")
    return fn


def find_pipeline_module(spec: str | Callable) -> None:
    """Check that a ``"module:function"`` reference's module can be found, without running it: for runs
    whose pipeline is imported by another process (spark-submit), the same error before that starts."""
    check_pipeline_ref(spec)
    if callable(spec):
        return
    module_name, _, attr = spec.partition(":")
    try:
        found = importlib.util.find_spec(module_name)
    except ImportError as exc:  # a parent package does not import
        raise _import_error(spec, module_name, attr, exc) from exc
    if found is None:
        raise _import_error(spec, module_name, attr, ModuleNotFoundError(f"No module named {module_name!r}",
                                                                         name=module_name))
