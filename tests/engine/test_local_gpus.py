"""Local mode finds the machine's GPUs (CUDA_VISIBLE_DEVICES, else nvidia-smi) without any setting;
where there are none, or on a cluster, the error names the setting that gives them.

This machine has no GPU: `fake_nvidia_smi.sh` goes first on PATH as ``nvidia-smi`` and answers
the engine's query for as many GPUs as ``FAKE_GPUS`` says. Pipelines run on the session's real
local Spark with ``DataContext.resources`` unset, so the slots come from the detection.
"""

from __future__ import annotations

import logging
import os
import shutil

import pyarrow as pa
import pytest

import airflow_streambatch.engine as sb
from airflow_streambatch.engine.spark import local_gpus
from airflow_streambatch.engine.spark.local_gpus import check_slots
from airflow_streambatch.engine.worker.udf import visible_devices
from airflow_streambatch.engine.spark.profiles import ClusterResourcesError

HERE = os.path.dirname(os.path.abspath(__file__))


def _which_gpu(batch: pa.Table) -> pa.Table:
    """The GPU ids the task was given, as its framework sees them."""
    return pa.table({"id": batch["id"], "gpu": [os.environ.get("CUDA_VISIBLE_DEVICES", "")] * batch.num_rows})


@pytest.fixture()
def fake_smi(tmp_path, monkeypatch):
    """A ``nvidia-smi`` first on PATH (a fresh PATH: the detection is cached per PATH); no CUDA_VISIBLE_DEVICES."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(os.path.join(HERE, "fake_nvidia_smi.sh"), bin_dir / "nvidia-smi")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return bin_dir / "nvidia-smi"


@pytest.fixture()
def detected(ctx):
    """The test's context with no resources given: slots come from Spark and the machine."""
    ctx.resources = None
    return ctx


def test_gpus_that_nvidia_smi_lists_are_slots_in_local_mode(detected, fake_smi, monkeypatch, caplog):
    monkeypatch.setenv("FAKE_GPUS", "2")
    with caplog.at_level(logging.INFO, logger=local_gpus.__name__):
        rows = sb.range(12, override_num_blocks=6).map_batches(_which_gpu, num_gpus=1,
                                                               batch_format="pyarrow").take_all()
    assert sorted(r["id"] for r in rows) == list(range(12))
    assert {r["gpu"] for r in rows} <= {"0", "1"}, "every GPU task runs with one of the two GPUs"
    assert f"local mode: 2 GPU(s) found ({fake_smi} lists 2)" in caplog.text


def test_cuda_visible_devices_decides_when_set(detected, fake_smi, monkeypatch, caplog):
    monkeypatch.setenv("FAKE_GPUS", "4")  # the machine has 4; this process may use 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with caplog.at_level(logging.INFO, logger=local_gpus.__name__):
        rows = sb.range(4, override_num_blocks=2).map_batches(_which_gpu, num_gpus=1, batch_format="pyarrow").take_all()
    assert len(rows) == 4 and {r["gpu"] for r in rows} == {"0"}
    assert "local mode: 1 GPU(s) found (CUDA_VISIBLE_DEVICES='0')" in caplog.text
    with pytest.raises(ClusterResourcesError, match=r"asks for GPU=2 per task but only 1 GPU slot"):
        sb.range(2).map_batches(_which_gpu, num_gpus=2, batch_format="pyarrow").take_all()


def test_no_gpu_found_names_the_setting(detected, tmp_path, monkeypatch):
    empty = tmp_path / "no-nvidia-smi"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # only the driver's lookup sees it: Spark's processes already run
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(ClusterResourcesError) as err:
        sb.range(3).map_batches(_which_gpu, num_gpus=1, batch_format="pyarrow").take_all()
    message = str(err.value)
    assert "asks for GPU=1 per task but only 0 GPU slot(s) exist: local mode (local[4]) found 0 GPU(s) " \
           "(CUDA_VISIBLE_DEVICES is unset and nvidia-smi is not on PATH)" in message
    assert "data_context={'resources': {'CPU': 4, 'GPU': 1}}" in message
    assert "DataContext.get_current().resources = {'CPU': 4, 'GPU': 1}" in message


def test_the_setting_it_names_works(detected, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CUDA's way of hiding every GPU
    with pytest.raises(ClusterResourcesError, match=r"found 0 GPU\(s\) \(CUDA_VISIBLE_DEVICES=''\)"):
        sb.range(3).map_batches(_which_gpu, num_gpus=1, batch_format="pyarrow").take_all()
    detected.resources = {"CPU": 4, "GPU": 1}
    rows = sb.range(3).map_batches(_which_gpu, num_gpus=1, batch_format="pyarrow").take_all()
    assert [r["gpu"] for r in rows] == ["0"] * 3


def test_a_broken_or_hung_nvidia_smi_counts_no_gpu(fake_smi, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_EXIT", "6")
    assert local_gpus.local_gpus() == local_gpus.LocalGpus(0, f"{fake_smi} exited 6: No devices were found")
    monkeypatch.delenv("FAKE_SMI_EXIT")
    monkeypatch.setenv("FAKE_SMI_SLEEP", "5")
    monkeypatch.setattr(local_gpus, "NVIDIA_SMI_TIMEOUT_S", 0.5)
    monkeypatch.setenv("PATH", f"{fake_smi.parent}{os.pathsep}{os.environ['PATH']}{os.pathsep}")  # a new cache key
    assert local_gpus.local_gpus() == local_gpus.LocalGpus(0, f"{fake_smi} did not answer within 0.5 s")


@pytest.mark.parametrize("value, devices", [
    ("", []), ("-1", []), ("0,1", ["0", "1"]), (" 2 , 3 ", ["2", "3"]), ("0,-1,2", ["0"]),
    ("GPU-8f0c6a2e-1b7d-4c0e-9f1a-2b3c4d5e6f70,MIG-1c2d/3/0", ["GPU-8f0c6a2e-1b7d-4c0e-9f1a-2b3c4d5e6f70",
                                                            "MIG-1c2d/3/0"]),
    ("NoDevFiles", []),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value, devices):
    assert visible_devices(value) == devices


def test_on_a_cluster_the_error_names_spark_resource_settings():
    with pytest.raises(ClusterResourcesError) as err:
        check_slots("k8s://https://10.0.0.1:443", [{"CPU": 1}, {"GPU": 1}], {"CPU": 8, "GPU": 0})
    message = str(err.value)
    assert "GPU=1 per task but only 0 GPU slot(s) exist: the executors of k8s://https://10.0.0.1:443 offer 0" in message
    assert "spark.executor.resource.gpu.amount and spark.executor.resource.gpu.discoveryScript" in message
    assert "docs/cluster-gpus.md" in message
    with pytest.raises(ClusterResourcesError, match=r"local mode \(local\[2\]\) cannot discover 'tpu'.*'tpu': 2"):
        check_slots("local[2]", [{"tpu": 1.5}], {"CPU": 2})
    check_slots("spark://h:7077", [{"CPU": 64, "GPU": 0.25}], {"CPU": 2, "GPU": 1})  # CPU time-shares: fine


def test_local_gpu_ids_are_positions_in_the_devices_the_worker_inherited(monkeypatch):
    """Local mode numbers GPUs 0..n-1 over ``CUDA_VISIBLE_DEVICES`` as CUDA does: with 5,7
    inherited, the driver's GPU 1 is device 7 (writing "1" sent the task to a device it
    was not given). A CPU task after it gets the inherited list back; a cluster's ids are
    Spark's addresses, the devices themselves."""
    from airflow_streambatch.engine.worker import udf

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    monkeypatch.delenv(udf._SET_BY_US, raising=False)
    udf.gpu_env(("1",), local=True)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"
    udf.gpu_env(("0",), local=True)  # the same (reused) worker, another GPU task
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    udf.gpu_env(())
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,7"
    udf.gpu_env(("3",), local=False)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    udf.gpu_env(())
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,7"
