"""Ray's deprecated ``parallelism=`` argument, still taken where Ray takes it: its ``read_*``
functions, ``from_items`` and ``range``.

Why a module of its own: Ray renamed ``parallelism`` to ``override_num_blocks`` (Ray 2.10) and
kept the old name on every one of these functions, with a ``DeprecationWarning`` and the same
meaning (``-1``, its default, is "let the engine decide"; a value given wins over
``override_num_blocks``, as Ray's ``_get_num_output_blocks`` lets it). Programs and tests written
for Ray before the rename pass ``parallelism=10``; one decorator takes it for all of them, as
`read_resources.with_read_resources` takes Ray's resource arguments.
"""

from __future__ import annotations

import functools
import inspect
import warnings

from airflow_streambatch.engine.errors import check_positive_int

AUTO = -1  # Ray's default for ``parallelism``: the engine decides


def with_parallelism(fn):
    """``fn`` (which takes ``override_num_blocks=``) also taking Ray's ``parallelism=``: a
    positive integer is used as ``override_num_blocks`` (with Ray's ``DeprecationWarning``);
    ``-1`` or ``None`` leaves ``override_num_blocks`` as given; anything else is a ``ValueError``
    naming the function and the argument."""
    where = fn.__name__

    @functools.wraps(fn)
    def call(*args, parallelism: int | None = AUTO, **kwargs):
        if parallelism is not None and parallelism != AUTO:
            check_positive_int(parallelism, f"{where}: parallelism")
            warnings.warn(f"{where}: the argument ``parallelism`` is deprecated in Ray 2.10. Please specify "
                          "argument ``override_num_blocks`` instead.", DeprecationWarning, stacklevel=2)
            kwargs["override_num_blocks"] = parallelism
        return fn(*args, **kwargs)

    signature = inspect.signature(fn)
    params = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    params.append(inspect.Parameter("parallelism", inspect.Parameter.KEYWORD_ONLY, default=AUTO))
    params += [p for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD]
    call.__signature__ = signature.replace(parameters=params)
    return call
