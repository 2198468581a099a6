"""The GPUs of the machine a ``local[N]`` Spark runs on, and the error that names the setting when a
pipeline asks for more GPUs (or other resources) than Spark can offer.

In local mode Spark places nothing by resource (stage-level scheduling needs executors), so
the driver's pool hands out GPU ids itself and must know how many there are. They are found
where the frameworks a UDF uses find them: ``CUDA_VISIBLE_DEVICES`` when it is set (the GPUs
this process may use: PyTorch, TensorFlow and JAX honour it, and an empty value hides them
all), else ``nvidia-smi`` on ``PATH`` (every GPU the NVIDIA driver sees), bounded by a
timeout: a driver in a bad state can hang it. Without either, local mode has no GPU and the
error says which setting gives the slots. On a cluster Spark owns the GPUs, so the error names
Spark's resource settings instead.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from airflow_streambatch.engine.spark.profiles import DOCS, ClusterResourcesError
from airflow_streambatch.engine.worker.udf import visible_devices

log = logging.getLogger(__name__)

NVIDIA_SMI_TIMEOUT_S = 10.0
NVIDIA_SMI_ARGS = ("--query-gpu=index", "--format=csv,noheader")


@dataclass(frozen=True)
class LocalGpus:
    """How many GPUs this machine offers to local mode, and how that was found (for the log and errors)."""

    count: int
    source: str


def local_gpus() -> LocalGpus:
    """The GPUs local mode may use: ``CUDA_VISIBLE_DEVICES``'s when set, else what ``nvidia-smi`` lists.
    Asked once per value of those two and ``PATH`` (``nvidia-smi`` takes up to a second)."""
    return _local_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("PATH", ""))


@functools.lru_cache(maxsize=8)
def _local_gpus(visible: str | None, path: str) -> LocalGpus:
    if visible is not None:
        return LocalGpus(len(visible_devices(visible)), f"CUDA_VISIBLE_DEVICES={visible!r}")
    smi = shutil.which("nvidia-smi", path=path)
    if smi is None:
        return LocalGpus(0, "CUDA_VISIBLE_DEVICES is unset and nvidia-smi is not on PATH")
    try:
        done = subprocess.run([smi, *NVIDIA_SMI_ARGS], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return LocalGpus(0, f"{smi} did not answer within {NVIDIA_SMI_TIMEOUT_S:g} s")
    except OSError as exc:
        return LocalGpus(0, f"{smi} could not run: {exc}")
    if done.returncode != 0:  # no driver, or "No devices were found" (exit 6)
        said = (done.stdout.strip() or done.stderr.strip()).splitlines()[:1]
        return LocalGpus(0, f"{smi} exited {done.returncode}{f': {said[0]}' if said else ''}")
    found = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return LocalGpus(len(found), f"{smi} lists {len(found)}")


def detect_local_gpus() -> int:
    """`local_gpus`'s count, logged with how it was found: local mode's GPU slots."""
    gpus = local_gpus()
    log.info("local mode: %d GPU(s) found (%s)", gpus.count, gpus.source)
    return gpus.count


def check_slots(master: str, requests: Iterable[Mapping[str, float]], slots: Mapping[str, float]) -> None:
    """Fail, naming the setting to change, when a request asks for more of a resource (``CPU`` aside:
    Spark's task slots serve any amount by time-sharing) than ``slots`` (what `slots_from_spark`
    found) has; the same condition the driver's pool checks, with the fix for where Spark runs."""
    for request in requests:
        for name, amount in request.items():
            have = slots.get(name, 0.0)
            if name == "CPU" or not amount or amount <= have:
                continue
            raise ClusterResourcesError(_message(master, name, amount, have, slots))


def _message(master: str, name: str, amount: float, have: float, slots: Mapping[str, float]) -> str:
    want = max(1, math.ceil(amount))
    resources = {"CPU": int(slots.get("CPU", 1)), name: want}
    head = f"an operator asks for {name}={amount:g} per task but only {have:g} {name} slot(s) exist"
    engine = (f"give the slots in the data_context argument of StreamBatchOperator, "
              f"data_context={{'resources': {resources}}}, or in the engine, "
              f"DataContext.get_current().resources = {resources}")
    if master.startswith("local"):
        if name != "GPU":
            return f"{head}: local mode ({master}) cannot discover {name!r}; {engine}"
        gpus = local_gpus()
        return (f"{head}: local mode ({master}) found {gpus.count} GPU(s) ({gpus.source}). On a machine with "
                f"GPUs, put nvidia-smi on PATH or set CUDA_VISIBLE_DEVICES (e.g. '0,1'); or {engine}")
    spark = "gpu" if name == "GPU" else name
    return (f"{head}: the executors of {master} offer {have:g}. Give the executors {spark}: "
            f"spark.executor.resource.{spark}.amount and spark.executor.resource.{spark}.discoveryScript (on a "
            f"standalone cluster, spark.worker.resource.{spark}.amount and its discoveryScript on the workers "
            f"that have it), in the Spark connection's extra conf or spark_conf; or {engine} ({DOCS})")
