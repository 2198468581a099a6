"""``@task.streambatch`` as users write it, run by Airflow on real local Spark.

The DAGs (tests/provider/dags/taskflow_test_dags.py) are loaded through Airflow's own DagBag,
so the decorated function lives in a module named ``unusual_prefix_<hash>_taskflow_test_dags``
that no other process can import, as in a real deployment; ``dag.test()`` then runs them.
A second ``dag.test()`` for the same logical date replaces the run (as test_dag_runs.py explains):
what it reruns is decided by the commit records alone, as after a Clear.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import threading

import pendulum
import pyarrow.parquet as pq
import pytest
from argv_watcher import ArgvWatcher
from pipelines import partitions_run, take_partitions_run, write_inputs

HERE = os.path.dirname(os.path.abspath(__file__))
DAG_FILE = os.path.join(HERE, "dags", "taskflow_test_dags.py")
LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")


@pytest.fixture(scope="module")
def bag():
    from airflow.dag_processing.dagbag import DagBag

    dags = DagBag(dag_folder=DAG_FILE)
    assert dags.import_errors == {}
    return dags


def _epoch(root, partitions: int) -> None:
    write_inputs(root / "in" / "2026-11-22", partitions=partitions)
    (root / "in" / "2026-11-22" / "_SUCCESS").write_text("")
    (root / "runs").mkdir()
    (root / "fail").write_text("")  # the listed partitions fail while it exists


def _run(dag, root, fail_partitions=()) -> dict:
    conf = {"root": str(root), "fail_partitions": list(fail_partitions)}
    dr = dag.test(logical_date=LOGICAL, run_after=LOGICAL, run_conf=conf)
    return {ti.task_id: ti.state for ti in dr.get_task_instances()}


def _rows(root) -> list[tuple]:
    files = sorted(glob.glob(f"{root}/out/2026-11-22/p*/*.parquet"))
    table = pq.ParquetDataset(files).read(columns=["id", "score", "label"])
    return sorted(zip(*(table[c].to_pylist() for c in ("id", "score", "label"))))


def _record(root) -> dict:
    return json.loads((root / "out" / "2026-11-22" / "_epoch.json").read_text())


def test_an_embedded_taskflow_epoch_reruns_only_its_failed_partition(ctx, airflow_db, bag, tmp_path):
    dag = bag.dags["tf_embedded"]
    task = dag.get_task("score")
    assert task.python_callable.__module__.startswith("unusual_prefix_")  # importable by no other process
    assert task.upstream_task_ids == {"wait_for_epoch", "pick_label"}  # the manifest's and the call's XComs
    assert task.doc_md == "Score the epoch's rows (the task's doc)."
    _epoch(tmp_path, partitions=4)

    assert _run(dag, tmp_path, fail_partitions=[1]) == {"wait_for_epoch": "success", "pick_label": "success",
                                                        "score": "failed"}
    assert [p["state"] for p in _record(tmp_path)["partitions"]] == ["committed", "failed", "committed", "committed"]
    assert set(take_partitions_run(tmp_path / "runs")) == {0, 1, 2, 3}

    (tmp_path / "fail").unlink()
    assert _run(dag, tmp_path, fail_partitions=[1])["score"] == "success"
    assert take_partitions_run(tmp_path / "runs") == [1]  # the committed partitions ran nowhere
    # the DAG file's helpers ran on the workers (by value) with the call's arguments: an XCom, a constant
    assert _rows(tmp_path) == [(i, i * 2 * 3, "from-xcom-scored") for i in range(400)]
    record = _record(tmp_path)
    assert record["status"] == "succeeded" and record["tries"] == 2
    assert [p["this_try"] for p in record["partitions"]] == [False, True, False, False]


class _SpecWatcher(ArgvWatcher):
    """Also reads the epoch spec spark-submit is given (its one application argument) while it exists."""

    def __init__(self):
        super().__init__()
        self.specs: dict[str, tuple[int, dict]] = {}

    def _read_properties(self, args: list[bytes]) -> None:
        super()._read_properties(args)
        for arg in args:
            path = arg.decode(errors="replace")
            if path.endswith("/epoch.json") and path not in self.specs:
                try:
                    with open(path, encoding="utf-8") as f:
                        self.specs[path] = (os.stat(path).st_mode & 0o777, json.load(f))
                except (OSError, ValueError):
                    pass


def test_spark_submit_ships_the_function_by_value_and_reruns_only_the_failed_partition(ctx, airflow_db, bag,
                                                                                       tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", '{"conn_type": "spark", "host": "local[2]"}')
    dag = bag.dags["tf_spark_submit"]
    _epoch(tmp_path, partitions=3)

    with _SpecWatcher() as watcher:
        assert _run(dag, tmp_path, fail_partitions=[0])["score"] == "failed"
    by_driver = partitions_run(tmp_path / "runs", by_driver=True)
    assert len(by_driver) == 1 and os.getpid() not in by_driver  # the function ran in spark-submit's driver
    assert [p["state"] for p in _record(tmp_path)["partitions"]] == ["failed", "committed", "committed"]
    # the function went in the spec file: 0600, gone afterwards, never on a command line
    assert watcher.spark_submit_jvms and len(watcher.specs) == 1
    (path, (mode, spec)), = watcher.specs.items()
    assert mode == 0o600 and not os.path.exists(path)
    shipped = spec["pipeline"]
    assert shipped["format"] == "cloudpickle-by-value"
    assert shipped["name"].endswith("_taskflow_test_dags.taskflow_dag.<locals>.score")  # a DAG factory's function
    assert spec["pipeline_kwargs"]["label"] == "from-xcom" and spec["pipeline_kwargs"]["factor"] == 3
    assert not [argv for argv in watcher.seen.values() if shipped["pickle"][:64].encode() in argv]

    (tmp_path / "fail").unlink()
    take_partitions_run(tmp_path / "runs")
    assert _run(dag, tmp_path, fail_partitions=[0])["score"] == "success"
    assert take_partitions_run(tmp_path / "runs") == [0]
    assert _rows(tmp_path) == [(i, i * 2 * 3, "from-xcom-scored") for i in range(300)]


LOAD_AND_CALL = """\
import sys
import pyarrow as pa
from pyspark import cloudpickle
fn = cloudpickle.loads(open(sys.argv[1], "rb").read())
print(fn(pa.table({"id": [1]})).column("label").to_pylist())
"""


def test_the_dag_files_helpers_travel_by_value_where_their_module_cannot_be_imported(tmp_path):
    """What a Spark Python worker gets. (Under ``dag.test()`` the DagBag module is replaced by a re-parse, so
    its functions would go by value anyway; a task process parses the file once and would send references.)"""
    from functools import partial

    from airflow.dag_processing.dagbag import DagBag
    from pyspark import cloudpickle

    from airflow_streambatch.epochs.pipeline_by_value import pickled_by_value

    fn = DagBag(dag_folder=DAG_FILE).dags["tf_embedded"].get_task("score").python_callable
    udf = partial(sys.modules[fn.__module__]._label, label="x")
    with pickled_by_value(fn, os.path.dirname(DAG_FILE)) as registered:
        assert fn.__module__ in registered
        (tmp_path / "by_value").write_bytes(cloudpickle.dumps(udf))
    assert fn.__module__ not in cloudpickle.list_registry_pickle_by_value()  # as it was
    (tmp_path / "by_reference").write_bytes(cloudpickle.dumps(udf))
    outcomes = {name: subprocess.run([sys.executable, "-c", LOAD_AND_CALL, str(tmp_path / name)], capture_output=True,
                                     text=True, timeout=120) for name in ("by_value", "by_reference")}
    assert outcomes["by_value"].stdout.strip() == "['x-scored']", outcomes["by_value"].stderr[-2000:]
    assert f"No module named '{fn.__module__}'" in outcomes["by_reference"].stderr


def test_a_function_that_cannot_be_pickled_fails_before_spark_submit_naming_what(tmp_path):
    from airflow.sdk import DAG, task

    from airflow_streambatch.epochs.pipeline_by_value import PipelineNotShippable

    lock = threading.Lock()
    with DAG("tf_unshippable", schedule=None, start_date=LOGICAL) as dag:
        @task.streambatch(input_path=str(tmp_path / "in"), output_path=str(tmp_path / "out"),
                          deploy_mode="spark_submit", conn_id="spark_local")
        def guarded(ds, epoch):
            with lock:
                return ds

        guarded()
    op = dag.get_task("guarded")
    with pytest.raises(PipelineNotShippable, match=r"@task\.streambatch guarded: deploy_mode='spark_submit' sends "
                                                   r"the function .*guarded to the spark-submit driver pickled by "
                                                   r"value.*pickling it failed on its variable it closes over 'lock' "
                                                   r"\(_thread\.lock: cannot pickle '_thread\.lock' object\)\. "
                                                   r"Create such objects"):
        op._driver_pipeline()


DAG_TEMPLATE = '''\
import pendulum
from airflow.sdk import DAG, task

with DAG("{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC")):
    @task.streambatch(input_path="/data/in", output_path="/data/out/{{{{ ds }}}}", {decorator})
    def {signature}:
        return ds

    {call}
'''


def _parse(folder, **dags: dict) -> dict:
    from airflow.dag_processing.dagbag import DagBag

    folder.mkdir(exist_ok=True)
    for dag_id, parts in dags.items():
        values = {"decorator": "", "signature": "pipeline(ds, epoch, **kwargs)", "call": "pipeline()", **parts}
        (folder / f"{dag_id}.py").write_text(DAG_TEMPLATE.format(dag_id=dag_id, **values))
    bag = DagBag(dag_folder=str(folder))
    return {path.rsplit("/", 1)[-1].removesuffix(".py"): error for path, error in bag.import_errors.items()} | {
        dag_id: None for dag_id in bag.dag_ids}


def test_the_operators_parse_time_checks_and_the_functions_shape_fail_the_dag_import(tmp_path):
    errors = _parse(
        tmp_path / "dags",
        good={"decorator": 'conn_id="spark_local", deploy_mode="spark_submit", data_context={"memory_limit": 1 << 30}',
              "signature": "pipeline(ds, epoch, *, threshold=0.5)", "call": 'pipeline(threshold="{{ params.t }}")'},
        typo={"decorator": 'data_context={"memory_limt": 1}'},
        mode={"decorator": 'deploy_mode="yarn"'},
        one_parameter={"signature": "pipeline(ds)"},
        context_key={"signature": "pipeline(ds, epoch, ti=None)"},
        positional={"signature": "pipeline(ds, epoch, threshold=0.5)", "call": "pipeline(0.7)"},
        unknown={"call": "pipeline(threshold=0.7)", "signature": "pipeline(ds, epoch)"},
        dataset_passed={"call": "pipeline(epoch=1)"},
        both_conns={"decorator": 'conn_id="a", streambatch_conn_id="b"'},
    )
    assert errors.pop("good") is None
    assert ("StreamBatchOperator pipeline: data_context has an unknown key 'memory_limt'. Did you mean "
            "'memory_limit'?") in errors.pop("typo")
    assert "deploy_mode='yarn') must be one of ('in_process', 'spark_submit')" in errors.pop("mode")
    assert ("@task.streambatch pipeline(ds): the function receives the epoch's dataset and the epoch as its first "
            "two parameters and returns the pipeline: def pipeline(ds, epoch, **kwargs)") in errors.pop("one_parameter")
    assert "parameter(s) ['ti'] are Airflow context keys" in errors.pop("context_key")
    assert "pass the pipeline's arguments by keyword" in errors.pop("positional")
    assert "got an unexpected keyword argument 'threshold'" in errors.pop("unknown")
    assert "['epoch'] receive the epoch's dataset and the epoch; the call cannot pass them" in errors.pop(
        "dataset_passed")
    assert "conn_id='a' and streambatch_conn_id='b' name the same connection" in errors.pop("both_conns")
    assert errors == {}


@pytest.mark.parametrize("deploy_mode", ["in_process", "spark_submit"])
def test_the_taskflow_example_dag_runs_with_airflow_dags_test(tmp_path, deploy_mode):
    """``dags/embed_taskflow.py`` as the README's demo runs it: ``airflow dags test`` in its own process,
    the DAG folder on its ``sys.path`` only (``text_pipelines`` reaches Spark by value)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__CORE__DAGS_FOLDER")}
    if deploy_mode == "spark_submit":
        env.update(STREAMBATCH_DEPLOY_MODE="spark_submit", STREAMBATCH_SPARK_CONN="spark_local",
                   AIRFLOW_CONN_SPARK_LOCAL='{"conn_type": "spark", "host": "local[2]"}')
    done = subprocess.run([sys.executable, "-m", "airflow_streambatch.demo", "run", "--dag", "embed_text_taskflow",
                           "--root", str(tmp_path / "demo"), "--hour", "2026-11-22T10", "--files", "3", "--rows", "50"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "embed_text_taskflow epoch 2026-11-22 10:00 UTC: 150 rows embedded (64 dims)" in done.stdout
    log = next((tmp_path / "demo" / "airflow").glob("embed_text_taskflow-*.log")).read_text()
    assert ("pickled by value for the spark-submit driver" in log) == (deploy_mode == "spark_submit")


def test_task_streambatch_is_found_through_the_provider_entry_point():
    """A fresh interpreter, as a DAG processor: ``task.streambatch`` comes from the provider's
    ``task-decorators`` (through the ``apache_airflow_provider`` entry point), nothing imported by hand."""
    script = textwrap.dedent("""\
        from airflow.sdk import task
        from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime
        decorators = ProvidersManagerTaskRuntime().taskflow_decorators
        print(decorators._raw_dict["streambatch"].args[0], task.streambatch.__module__, task.streambatch.__name__)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == ["airflow_streambatch.decorators.streambatch.streambatch_task",
                                        "airflow_streambatch.decorators.streambatch", "streambatch_task"]
