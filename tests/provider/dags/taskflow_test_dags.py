"""``@task.streambatch`` DAGs the TaskFlow tests run with ``dag.test()`` (test_taskflow_decorator.py).

The pipeline function and its helpers live here, in the DAG file, not in an importable
pipeline module: Spark's Python workers cannot import this file (the DAG folder is on the
test process's ``sys.path`` only), and loaded through Airflow's DagBag it is a module named
``unusual_prefix_<hash>_taskflow_test_dags`` that no process can import. So the tests pass
only if the function, ``_label`` and the closure in ``score`` travel by value.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pendulum
import pyarrow as pa
import pyarrow.compute as pc
from airflow.sdk import DAG, Param, task
from pipelines import score as score_rows

from airflow_streambatch.sensors.epoch import EpochSensor

PARAMS = {
    "root": Param("/tmp/streambatch-test-data", type="string"),
    "fail_partitions": Param([], type="array"),
}
SUFFIX = "-scored"  # a module global the pipeline uses: pickled with it


def _label(batch: pa.Table, label: str) -> pa.Table:
    """A UDF defined in the DAG file (by value to the workers)."""
    return batch.append_column("label", pa.array([f"{label}{SUFFIX}"] * batch.num_rows, pa.string()))


def taskflow_dag(dag_id: str, **decorator_kwargs) -> DAG:
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"), catchup=False,
             params=PARAMS, render_template_as_native_obj=True, tags=["streambatch-tests"]) as dag:
        wait = EpochSensor(task_id="wait_for_epoch", input_path="{{ params.root }}/in/{{ ds }}", poke_interval=1,
                           timeout=60)

        @task
        def pick_label() -> str:
            return "from-xcom"

        @task.streambatch(manifest=wait.output, output_path="{{ params.root }}/out/{{ ds }}",
                          data_context={"progress_interval_s": 0}, retry_delay=timedelta(seconds=1),
                          **decorator_kwargs)
        def score(ds, epoch, *, label: str, runs_dir: str, fail_partitions=(), factor: int = 1):
            """Score the epoch's rows (the task's doc)."""
            scaled = partial(_scale, factor=factor)  # a closure over a call argument
            return (score_rows(ds, epoch, runs_dir=runs_dir, fail_flag=f"{runs_dir}/../fail",
                               fail_partitions=fail_partitions)
                    .map_batches(scaled, batch_format="pyarrow")
                    .map_batches(partial(_label, label=label), batch_format="pyarrow"))

        score(label=pick_label(), runs_dir="{{ params.root }}/runs", fail_partitions="{{ params.fail_partitions }}",
              factor=3)
    return dag


def _scale(batch: pa.Table, factor: int) -> pa.Table:
    return batch.set_column(batch.schema.get_field_index("score"), "score", pc.multiply(batch["score"], factor))


tf_embedded = taskflow_dag("tf_embedded")
tf_spark_submit = taskflow_dag("tf_spark_submit", deploy_mode="spark_submit", conn_id="spark_local")
