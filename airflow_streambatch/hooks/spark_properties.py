"""Spark properties that hold secrets: which they are, and how they reach a JVM off its command line.

Connection properties hold secrets (S3 keys, Azure account keys, tokens). spark-submit
would put every ``--conf k=v`` on a command line any local user reads with ``ps`` (and
SparkSubmitHook logs its command), so the properties go in a 0600 file in a private
directory instead (``--properties-file``), deleted once the JVM has read it; sensitive
values are registered with Airflow's secrets masker before anything logs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator

from airflow.sdk.log import mask_secret

from airflow_streambatch.engine.atomic_files import atomic_write

# Spark's default `spark.redaction.regex` is (?i)secret|password|token|access[.]?key; this adds
# Azure account keys, SAS tokens and connection strings, credentials and key files, and the
# environment variables' spelling (``spark.executorEnv.AWS_ACCESS_KEY_ID``,
# ``...AZURE_STORAGE_ACCOUNT_KEY``). Keys (or values) it matches are hidden in the Spark UI
# and masked in Airflow's logs.
SENSITIVE = (r"(?i)secret|password|passwd|token|access[._]?key|account[._]?key|(^|[.])sas([.]|$)|credential"
             r"|private[.]?key|keyfile|encryption[.]?key|signature|connection[._]?string"
             r"|api[._]?key|authorization")  # OpenLineage's injected transport: auth.apiKey, headers.Authorization
_SENSITIVE = re.compile(SENSITIVE)
_PROPERTIES_SPECIAL = "=:#! \t\n\r\f"


def mask_sensitive(conf: dict[str, str]) -> None:
    """Register the values of sensitive Spark properties with Airflow's secrets masker."""
    for key, value in conf.items():
        if _SENSITIVE.search(key):
            mask_secret(value)


@contextlib.contextmanager
def properties_file(conf: dict[str, str]) -> Iterator[str]:
    """``conf`` as a Java properties file, 0600 in a private (0700) directory, removed on exit.

    ``--properties-file`` replaces spark-defaults.conf, so its properties come first
    (later lines win). Special characters are escaped (Azure keys end in ``==``).
    """
    from pyspark.find_spark_home import _find_spark_home

    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(_find_spark_home(), "conf")
    defaults = os.path.join(conf_dir, "spark-defaults.conf")
    private = tempfile.mkdtemp(prefix="streambatch-conf-")
    try:
        path = os.path.join(private, "spark.properties")
        text = ""
        if os.path.isfile(defaults):
            with open(defaults, encoding="utf-8") as d:
                text = d.read() + "\n"
        atomic_write(path, text + "".join(f"{_escape(k)}={_escape(v)}\n" for k, v in conf.items()))
        yield path
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _escape(text: str) -> str:
    text = text.replace("\\", "\\\\")
    return "".join(f"\\u{ord(c):04x}" if c in _PROPERTIES_SPECIAL else c for c in text)
