"""docker-compose.yaml without a Docker engine: the file parses, its services, commands, image
tags and versions agree with each other and with this package, and the Spark cluster,
connection and S3-compatible store it defines work when the same commands run as plain
processes on this machine, each Spark worker in a mount namespace of its own (a private
/dev/shm and /tmp, as a container has), so the cluster shares no block directory."""

from __future__ import annotations

import configparser
import importlib.util
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

from datetime import datetime, timezone

import boto3
import pytest
import yaml
from namespaced_cluster import HOST_WRAPPER, kill_namespace, mount_namespace, namespaces_unsupported
from ports import wait_for_port
from standalone_cluster import free_port

from airflow_streambatch import demo

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


def _dockerfile() -> str:
    with open(os.path.join(REPO, ".ci", "docker", "Dockerfile")) as f:
        return f.read()


def _setup_cfg() -> configparser.ConfigParser:
    setup = configparser.ConfigParser()
    setup.read(os.path.join(REPO, "setup.cfg"))
    return setup


def test_compose_has_airflow_3_and_a_spark_cluster_from_one_image(compose):
    services = compose["services"]
    assert {"postgres", "airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
            "airflow-triggerer", "spark-master", "spark-worker-1", "spark-worker-2", "object-store"} <= set(services)
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
    assert f"pyspark=={pyspark.__version__}" in _setup_cfg()["options"]["install_requires"]


def test_every_airflow_command_exists_in_the_pinned_airflow(compose):
    for name, service in compose["services"].items():
        command = service.get("command")
        if not name.startswith("airflow-"):
            continue
        # the apache/airflow entrypoint runs `airflow <command>`
        proc = subprocess.run([AIRFLOW, *command, "--help"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{name}: airflow {' '.join(command)}: {proc.stderr[-2000:]}"


# the services' environment that points at the object store (docker-compose.yaml's x-object-store-env)
STORE_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",
             "AWS_EC2_METADATA_DISABLED")
# the services that read or write the demo's data (the Spark master only for the shared anchor)
STORE_CLIENTS = ("airflow-init", "airflow-apiserver", "airflow-scheduler", "airflow-dag-processor",
                 "airflow-triggerer", "make-epoch", "spark-master", "spark-worker-1", "spark-worker-2", "spark-connect")


def test_the_object_store_runs_moto_from_the_shared_image_and_every_client_points_at_it(compose):
    services = compose["services"]
    store = services["object-store"]
    assert store["image"] == services["airflow-scheduler"]["image"] == services["spark-worker-1"]["image"]
    assert store["build"] == services["spark-worker-1"]["build"]
    assert store["command"] == ["python", "-m", "moto.server", "-H", "0.0.0.0", "-p", "9000"]
    assert "9000:9000" in store["ports"]
    assert "http://localhost:9000/" in " ".join(store["healthcheck"]["test"])
    # the image has the server, at the version the tests run
    pin = re.search(r"moto\[server\]==\S+", _setup_cfg()["options.extras_require"]["test"]).group(0)
    assert f'"{pin}"' in _dockerfile()
    assert set(services) >= set(STORE_CLIENTS)
    assert {name for name in services if name.startswith(("airflow-", "spark-"))} <= {*STORE_CLIENTS, "spark-history"}
    for name in STORE_CLIENTS:
        env = services[name]["environment"]
        assert env["AWS_ENDPOINT_URL"] == "http://object-store:9000", name
        assert set(STORE_ENV) <= set(env), name
        assert env["AWS_REGION"] == "us-east-1" and env["AWS_EC2_METADATA_DISABLED"] == "true", name
    for name in ("airflow-scheduler", "airflow-triggerer", "spark-worker-1", "spark-worker-2", "make-epoch"):
        assert services[name]["depends_on"]["object-store"] == {"condition": "service_healthy"}, name
    # the history server reads only the event log, on the volume: no store credentials
    assert not any(k.startswith("AWS_") for k in services["spark-history"]["environment"])
    root = services["airflow-scheduler"]["environment"]["STREAMBATCH_DEMO_ROOT"]
    assert root.startswith("s3://") and services["make-epoch"]["environment"]["STREAMBATCH_DEMO_ROOT"] == root
    assert services["make-epoch"]["command"] == ["python", "-m", "airflow_streambatch.demo", "generate"]


def test_the_example_dag_reads_and_writes_the_compose_store_where_make_epoch_writes(compose, monkeypatch):
    from jinja2 import Template

    root = compose["services"]["airflow-scheduler"]["environment"]["STREAMBATCH_DEMO_ROOT"]
    monkeypatch.setenv("STREAMBATCH_DEMO_ROOT", root)
    path = os.path.join(REPO, "dags", "text_embedding.py")
    spec = importlib.util.spec_from_file_location("text_embedding_compose", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = module.embed_text_light
    hour = datetime(2026, 11, 22, 9, tzinfo=timezone.utc)
    sensor, embed = dag.get_task("wait_for_epoch"), dag.get_task("embed")
    assert Template(sensor.input_path).render(data_interval_start=hour) == demo._hour_path(root, "in", hour)
    assert Template(embed.output_path).render(data_interval_start=hour) == demo._hour_path(root, "embeddings", hour)
    assert demo._hour_path(root, "in", hour) == f"{root}/in/2026-11-22/09"
    assert embed.output_asset.uri == f"{root}/embeddings"  # the store's own URI, not file://s3://...


def _outside_docker(text: str, ports: dict[str, int], data_dir: str) -> str:
    """Service host names -> 127.0.0.1, container ports -> free local ports, /data -> a temp dir,
    a container's every interface (0.0.0.0) -> 127.0.0.1."""
    for host in ("spark-master", "spark-connect", "airflow-scheduler", "object-store", "0.0.0.0"):
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
@pytest.mark.parametrize("connection", ["spark_cluster", "spark_connect"])
def test_the_compose_spark_cluster_runs_the_example_dag_through_its_connection(compose, tmp_path, monkeypatch,
                                                                              connection):
    """Through ``spark_cluster`` the Airflow task is the driver; through ``spark_connect`` the compose file's
    Connect server (a "host" of its own, as the workers are) is, and the task its client."""
    services = compose["services"]
    ports = {p: free_port() for p in ("7077", "8081", "8082", "8083", "9000", "15002")}
    shared = tempfile.mkdtemp(prefix="streambatch-compose-", dir="/var/tmp")  # /tmp is private to each worker
    # this session's own S3 server and keys (conftest.py) stay out: every process gets the compose store's
    env = dict({k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
               PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", SPARK_LOCAL_IP="127.0.0.1",
               SPARK_WORKER_DIR=f"{shared}/work", SPARK_LOG_DIR=f"{shared}/logs")
    procs = []
    try:
        store = services["object-store"]["command"]
        assert store[:3] == ["python", "-m", "moto.server"]
        procs.append(subprocess.Popen([sys.executable, *(_outside_docker(arg, ports, shared) for arg in store[1:])],
                                      env=env, start_new_session=True, stdout=open(tmp_path / "object-store.log", "w"),
                                      stderr=subprocess.STDOUT))
        wait_for_port(ports["9000"], procs[-1], "docker-compose.yaml's object store")
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
        if connection == "spark_connect":
            shell, flag, script = services["spark-connect"]["command"]
            procs.append(subprocess.Popen([*HOST_WRAPPER, shell, flag, _outside_docker(script, ports, shared)],
                                          env=env, start_new_session=True, stdout=open(tmp_path / "connect.log", "w"),
                                          stderr=subprocess.STDOUT))
            wait_for_port(ports["15002"], procs[-1], "docker-compose.yaml's Spark Connect server", timeout=120)

        airflow_env = {k: _outside_docker(str(v), ports, shared)
                       for k, v in services["airflow-scheduler"]["environment"].items()
                       if k.startswith(("AIRFLOW_CONN_", "STREAMBATCH_", "AWS_", "SPARK_LOCAL"))}
        airflow_env["STREAMBATCH_SPARK_CONN"] = connection
        assert airflow_env["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{ports['9000']}"
        root = airflow_env["STREAMBATCH_DEMO_ROOT"]
        assert root.startswith("s3://")
        run_env = {k: v for k, v in env.items() if not k.startswith(("AIRFLOW", "PYSPARK"))}
        # generates the hour's input into the store (creating the bucket), runs the DAG, checks the output
        proc = subprocess.run([sys.executable, "-m", "airflow_streambatch.demo", "run", "--dag", "embed_text_light",
                               "--hour", "2026-11-22T10", "--root", root, "--airflow-home", str(tmp_path / "airflow")],
                              env={**run_env, **airflow_env}, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "1000 rows embedded (64 dims)" in proc.stdout
        assert f"output: {root}/embeddings/2026-11-22/10" in proc.stdout
        apps = _master_state(ports["8081"])["completedapps"] + _master_state(ports["8081"])["activeapps"]
        # ran on the cluster: in the task's own application, or in the Connect server's
        assert [a["name"] for a in apps] == [{"spark_cluster": "streambatch-embed_text_light-embed",
                                              "spark_connect": "streambatch-connect-server"}[connection]]

        # the output is in the compose store, read back here: one embedding per input row, no duplicates
        for name in STORE_ENV:
            monkeypatch.setenv(name, airflow_env[name])
        hour = datetime(2026, 11, 22, 10, tzinfo=timezone.utc)
        summary = demo.check_output(root, hour, demo.DIMS["embed_text_light"])
        assert summary["rows"] == 1000 and summary["files"] >= 1
        bucket, prefix = root[len("s3://"):].split("/", 1)
        keys = [o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]]
        assert any(k.startswith(f"{prefix}/in/2026-11-22/10/") and k.endswith(".parquet") for k in keys)
        assert any(re.fullmatch(rf"{prefix}/embeddings/2026-11-22/10/p\d+/_commit\.json", k) for k in keys)
        # every commit finished: no run's staging is left (pyarrow keeps an empty `_staging/` marker)
        assert not [k for k in keys if re.search(r"/_staging/.", k)]
        assert not os.path.exists(f"{shared}/streambatch-demo")  # nothing went to the volume
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
