"""Pickling an operator for the executors, and saying what in it cannot be pickled.

Why: an operator's functions travel to Spark's Python workers pickled (cloudpickle, as Ray
pickles a task's function). A function that closes over a lock, an open file or a client
connection cannot travel, and pickle's own error (``cannot pickle '_thread.lock' object``)
names neither the operator nor the variable. Ray raises ``TypeError`` and prints which
variable "was found to be non-serializable" (``ray.util.inspect_serializability``); this
raises the same type with the same words, naming the operator, the argument
(``fn``, ``fn_args``, ``fn_constructor_args``, ...) and the variable, and what to do.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from pyspark import cloudpickle

from airflow_streambatch.engine.errors import StreamBatchError


class UnserializableFunctionError(StreamBatchError, TypeError):
    """An operator's function, or an argument given with it, cannot be pickled for the executors."""


def pickled_operator(payload: Any, operator: str) -> bytes:
    """``payload`` (an operator's `OperatorPayload`) pickled, or `UnserializableFunctionError`
    naming what in ``operator``'s functions and arguments could not be."""
    try:
        return cloudpickle.dumps(payload)
    except Exception as exc:  # noqa: BLE001 - pickle raises TypeError, PicklingError, AttributeError...
        culprits = [c for t in [*payload.transforms, *payload.build_ahead] for c in _culprits(t)]
        found = "; ".join(culprits) or f"something it holds ({type(exc).__name__}: {exc})"
        raise UnserializableFunctionError(
            f"Could not serialize the function of {operator} for the executors: {exc}. {found} was found to be "
            "non-serializable. Create such an object inside the function, or in the __init__ of a class given "
            "to map_batches (built on the executors), instead of capturing it from the driver"
        ) from exc


def _pickles(value: Any) -> bool:
    try:
        cloudpickle.dumps(value)
        return True
    except Exception:  # noqa: BLE001 - any failure means it cannot travel
        return False


def _culprits(transform: Any) -> list[str]:
    """What in ``transform``'s fields does not pickle, each as ``"<operator>'s <field>: ..."``."""
    if not dataclasses.is_dataclass(transform) or _pickles(transform):
        return []
    found = []
    for f in dataclasses.fields(transform):
        value = getattr(transform, f.name)
        if _pickles(value):
            continue
        where = f"{transform.name}'s {f.name}"
        if isinstance(value, (tuple, list)):
            found += [f"{where}[{i}] ({_type(v)})" for i, v in enumerate(value) if not _pickles(v)]
        elif isinstance(value, dict):
            found += [f"{where}[{k!r}] ({_type(v)})" for k, v in value.items() if not _pickles(v)]
        else:
            variables = _captured(value)
            found += [f"{where} {_name(value)}: variable {n!r} ({_type(v)})" for n, v in variables] or \
                [f"{where} ({_type(value)})"]
    return found


def _captured(fn: Any) -> list[tuple[str, Any]]:
    """The variables a function (or a ``functools.partial``'s) captures that do not pickle."""
    fn = getattr(fn, "func", fn)  # functools.partial
    if not inspect.isfunction(fn):
        return []
    try:
        names = inspect.getclosurevars(fn)
    except (TypeError, ValueError):
        return []
    return [(n, v) for scope in (names.nonlocals, names.globals) for n, v in scope.items()
            if not inspect.ismodule(v) and not _pickles(v)]


def _name(fn: Any) -> str:
    return getattr(getattr(fn, "func", fn), "__qualname__", _type(fn))


def _type(value: Any) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__
