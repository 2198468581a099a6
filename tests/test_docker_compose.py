"""docker-compose.yaml without a Docker engine: the file parses, its services, commands, image
tags and versions agree with each other and with this package, and the Spark cluster and
connection it defines work when the same commands run as plain processes on this machine,
each Spark worker in a mount namespace of its own (a private /dev/shm and /tmp, as a
container has), so the cluster shares no block directory."""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
import yaml
from namespaced_cluster import HOST_WRAPPER, kill_namespace, mount_namespace, namespaces_unsupported
from standalone_cluster import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AIRFLOW = os.path.join(os.path.dirname(sys.executable), "airflow")
VENV_BIN = os.path.dirname(sys.executable)  # pip puts spark-class next to the interpreter


@pytest.fixture(scope="module")
def compose() -> dict:
    with open(os.path.join(REPO, "docker-compose.yaml")) as f:
        return yaml.safe_load(f)


def _dockerfile_args() -> dict[str, str]:
    with open(os.path.join(REPO, ".ci", "docker", "Dockerfile")) as f:
        return dict(re.findall(r"^ARG (\w+)=(\S+)$", f.read(), re.M))


def test_compose_has_airflow_3_and_a_spark_cluster_from_one_image(compose):
    services = compose["services"]
    assert {"postgres", "airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
            "airflow-triggerer", "spark-master", "spark-worker-1", "spark-worker-2"} <= set(services)
    ours = {name: s for name, s in services.items() if name != "postgres"}
    assert len({s["image"] for s in ours.values()}) == 1, "driver and executors must share Spark and Python"
    assert all(s["build"]["dockerfile"] == ".ci/docker/Dockerfile" for s in ours.values())
    for name, service in ours.items():
        for dep in service.get("depends_on") or []:
            assert dep in services, f"{name} depends on unknown service {dep}"


def test_image_tag_build_args_dockerfile_and_installed_versions_agree(compose):
    import airflow
    import pyspark

    service = compose["services"]["airflow-scheduler"]
    args = service["build"]["args"]
    assert args == {k: v for k, v in _dockerfile_args().items() if k in args}
    assert args["AIRFLOW_VERSION"] == airflow.__version__
    assert args["PYTHON_VERSION"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert service["image"].endswith(f"airflow{args['AIRFLOW_VERSION']}-python{args['PYTHON_VERSION']}")
    setup = configparser.ConfigParser()
    setup.read(os.path.join(REPO, "setup.cfg"))
    assert f"pyspark=={pyspark.__version__}" in setup["options"]["install_requires"]


def test_every_airflow_command_exists_in_the_pinned_airflow(compose):
    for name, service in compose["services"].items():
        command = service.get("command")
        if not name.startswith("airflow-"):
            continue
        # the apache/airflow entrypoint runs `airflow <command>`
        proc = subprocess.run([AIRFLOW, *command, "--help"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{name}: airflow {' '.join(command)}: {proc.stderr[-2000:]}"


def _outside_docker(text: str, ports: dict[str, int], data_dir: str) -> str:
    """Service host names -> 127.0.0.1, container ports -> free local ports, /data -> a temp dir."""
    for host in ("spark-master", "airflow-scheduler"):
        text = text.replace(host, "127.0.0.1")
    for port, local in ports.items():
        text = re.sub(rf"\b{port}\b", str(local), text)
    return text.replace("/data/", f"{data_dir}/")


def test_the_history_server_reads_the_event_log_the_airflow_tasks_write(compose):
    services = compose["services"]
    airflow_env = services["airflow-scheduler"]["environment"]
    history = services["spark-history"]
    opts = dict(re.findall(r"-D(\S+?)=(\S+)", history["environment"]["SPARK_HISTORY_OPTS"]))
    event_dir = airflow_env["AIRFLOW__STREAMBATCH__SPARK_EVENT_LOG_DIR"]
    assert opts["spark.history.fs.logDirectory"] == f"file://{event_dir}"
    assert f"mkdir -p -m 700 {event_dir} " in history["command"][2]  # private, and there before Spark needs it
    assert any(volume.startswith("streambatch-data:/data") for volume in history["volumes"])  # the tasks' volume
    port = opts["spark.history.ui.port"]
    assert f"{port}:{port}" in history["ports"]
    assert airflow_env["AIRFLOW__STREAMBATCH__SPARK_HISTORY_SERVER_URL"] == f"http://localhost:{port}"  # the browser's
    assert "org.apache.spark.deploy.history.HistoryServer" in history["command"][2]


def test_compose_shares_no_block_directory(compose):
    for name, service in compose["services"].items():
        assert "STREAMBATCH_BLOCK_DIR" not in service.get("environment", {}), name
    for name in ("spark-worker-1", "spark-worker-2", "airflow-scheduler"):
        assert compose["services"][name]["shm_size"] == "2gb"  # blocks live in each container's /dev/shm


@pytest.mark.skipif(namespaces_unsupported() is not None, reason=f"workers as hosts: {namespaces_unsupported()}")
def test_the_compose_spark_cluster_runs_the_example_dag_through_its_connection(compose, tmp_path):
    services = compose["services"]
    ports = {p: free_port() for p in ("7077", "8081", "8082", "8083")}
    shared = tempfile.mkdtemp(prefix="streambatch-compose-", dir="/var/tmp")  # /tmp is private to each worker
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", SPARK_LOCAL_IP="127.0.0.1",
               SPARK_WORKER_DIR=f"{shared}/work", SPARK_LOG_DIR=f"{shared}/logs")
    procs = []
    try:
        for name in ("spark-master", "spark-worker-1", "spark-worker-2"):
            shell, flag, script = services[name]["command"]
            assert (shell, flag) == ("bash", "-c")
            service_env = {k: _outside_docker(str(v), ports, shared)
                           for k, v in services[name]["environment"].items()}
            host = HOST_WRAPPER if name.startswith("spark-worker") else []
            procs.append(subprocess.Popen([*host, "bash", "-c", _outside_docker(script, ports, shared)],
                                          env={**env, **service_env}, start_new_session=True,
                                          stdout=open(tmp_path / f"{name}.log", "w"), stderr=subprocess.STDOUT))
            if name == "spark-master":
                _wait_for_workers(ports["8081"], 0)
        _wait_for_workers(ports["8081"], 2)

        airflow_env = {k: _outside_docker(str(v), ports, shared)
                       for k, v in services["airflow-scheduler"]["environment"].items()
                       if k.startswith(("AIRFLOW_CONN_", "STREAMBATCH_"))}
        run_env = {k: v for k, v in env.items() if not k.startswith(("AIRFLOW", "PYSPARK"))}
        demo = subprocess.run([sys.executable, "-m", "airflow_streambatch.demo", "run", "--dag", "embed_text_light",
                               "--hour", "2026-11-22T10", "--root", airflow_env["STREAMBATCH_DEMO_ROOT"]],
                              env={**run_env, **airflow_env}, capture_output=True, text=True, timeout=600)
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert "1000 rows embedded (64 dims)" in demo.stdout
        apps = _master_state(ports["8081"])["completedapps"] + _master_state(ports["8081"])["activeapps"]
        assert [a["name"] for a in apps] == ["streambatch-embed_text_light-embed"]  # ran on the cluster
    finally:
        for proc in procs:
            namespace = mount_namespace(proc.pid)
            if namespace is not None and namespace != mount_namespace():
                kill_namespace(namespace)  # the worker "host": its executors and block agent too
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(shared, ignore_errors=True)


def _master_state(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
        return json.loads(response.read())


def _wait_for_workers(ui_port: int, workers: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if sum(w["state"] == "ALIVE" for w in _master_state(ui_port)["workers"]) >= workers:
                return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"the Spark master of docker-compose.yaml (UI port {ui_port}) saw fewer than {workers} workers")
