"""Mistakes in a StreamBatchOperator's pipeline reference or data_context fail the DAG file's import,
as a user sees it: Airflow's DagBag parses a real DAG folder and its import error names the argument
and the fix. What only a template or an XCom gives waits for the task, and is checked there.
"""

from __future__ import annotations

import textwrap

import pendulum
import pytest

from airflow_streambatch.engine.context import DataContext
from airflow_streambatch.epochs.manifest import EpochManifest
from airflow_streambatch.epochs.runner import run_epoch

DAG_FILE = '''\
import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG
from airflow_streambatch.operators.streambatch import StreamBatchOperator

with DAG("{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
         params={{"ctx": {{}}, "pipeline": "pipelines:score"}}):
    StreamBatchOperator(task_id="score", input_path="/data/in", output_path="/data/out", {args})
'''


def _parse(folder, **dags: str) -> dict:
    """Write one DAG file per ``dag_id -> operator arguments`` and parse the folder as Airflow does:
    file name -> import error."""
    from airflow.dag_processing.dagbag import DagBag

    folder.mkdir(exist_ok=True)
    for dag_id, args in dags.items():
        (folder / f"{dag_id}.py").write_text(DAG_FILE.format(dag_id=dag_id, args=args))
    bag = DagBag(dag_folder=str(folder))  # safe mode, as the DAG processor: files that mention DAG and airflow
    return {path.rsplit("/", 1)[-1].removesuffix(".py"): error for path, error in bag.import_errors.items()} | {
        dag_id: None for dag_id in bag.dag_ids}


def test_a_dot_for_the_colon_fails_the_import_with_the_spelling_to_use(tmp_path):
    errors = _parse(tmp_path / "dags", churn='pipeline="churn.pipeline.score"', bare='pipeline="score"',
                    path='pipeline="dags/churn/pipeline.py:score"', number="pipeline=3")
    assert ("ValueError: StreamBatchOperator score: pipeline='churn.pipeline.score' must be 'module:function'. "
            "Did you mean 'churn.pipeline:score'?") in errors["churn"]
    for error in errors.values():  # the example is right: the DAG folder is on sys.path, so no "dags." prefix
        assert "'embed:pipeline' is the function pipeline of dags/embed.py" in error
        assert "dags.embed" not in error
    assert "pipeline='score' must be 'module:function'." in errors["bare"]
    assert "Did you mean 'churn.pipeline:score'?" in errors["path"]
    assert "pipeline must be 'module:function' or the function itself, got int 3" in errors["number"]


def test_a_data_context_typo_fails_the_import_naming_the_key_and_the_close_match(tmp_path):
    errors = _parse(tmp_path / "dags", typo='pipeline="pipelines:score", data_context={"memory_limt": 1}',
                    stranger='pipeline="pipelines:score", data_context={"colour": "blue"}',
                    nested='pipeline="p:f", data_context={"execution_options": {"preserve_ordr": True}}')
    assert ("ValueError: StreamBatchOperator score: data_context has an unknown key 'memory_limt'. "
            "Did you mean 'memory_limit'?") in errors["typo"]
    assert "data_context has an unknown key 'colour'. The settings are: target_max_block_size" in errors["stranger"]
    assert ("data_context['execution_options'] has no setting 'preserve_ordr'. Did you mean 'preserve_order'?"
            in errors["nested"])


@pytest.mark.parametrize("data_context, message", [
    ('{"memory_limit": -1}', "data_context['memory_limit'] must be a positive integer, got -1"),
    ('{"memory_limit": "2GiB"}', "data_context['memory_limit'] must be a positive integer, got '2GiB'"),
    ('{"scheduling_policy": "adaptve"}',
     "data_context['scheduling_policy'] must be one of ('adaptive', 'conservative'), got 'adaptve'. "
     "Did you mean 'adaptive'?"),
    ('{"resources": {"GPU": "one"}}', "data_context['resources']['GPU'] must be a number >= 0, got 'one'"),
    ('{"resources": [1, 2]}', "data_context['resources'] must be a dict such as {'CPU': 4, 'GPU': 1}"),
    ('{"group_scheduling": "no"}', "data_context['group_scheduling'] must be True or False, got 'no'"),
    ('{"task_timeout_s": 0}', "data_context['task_timeout_s'] must be a positive number of seconds or None"),
    ('["memory_limit", 1]', "data_context must be a dict of DataContext settings"),
])
def test_a_wrong_data_context_value_fails_the_import(tmp_path, data_context, message):
    errors = _parse(tmp_path / "dags", bad=f'pipeline="pipelines:score", data_context={data_context}')
    assert f"ValueError: StreamBatchOperator score: {message}" in errors["bad"]


def test_templates_xcoms_and_unimported_modules_wait_for_the_task(tmp_path):
    folder = tmp_path / "dags"
    folder.mkdir()
    # a pipeline module that fails when imported: the DAG still parses, since parsing imports no pipeline
    (folder / "heavy.py").write_text("raise RuntimeError('imported at parse time')\n")
    errors = _parse(
        folder,
        templated='pipeline="{{ params.pipeline }}", data_context={"memory_limit": "{{ params.mem }}", '
                  '"resources": {"GPU": "{{ params.gpus }}"}, "max_task_retries": 1}',
        whole="pipeline=\"heavy:pipeline\", data_context=\"{{ params.ctx }}\"",
        missing='pipeline="no_such_module:fn", data_context={"progress_interval_s": 0}',
        xcoms='pipeline=EmptyOperator(task_id="which").output, data_context=EmptyOperator(task_id="ctx").output',
    )
    assert errors == {"templated": None, "whole": None, "missing": None, "xcoms": None}


def test_a_rendered_data_context_is_checked_when_the_task_runs(tmp_path):
    """A template gives the task a data_context with a typo: the task fails before any Spark work,
    with the same message the parser would have given."""
    errors = _parse(tmp_path / "dags", rendered='pipeline="pipelines:score", data_context="{{ params.ctx }}"')
    assert errors == {"rendered": None}
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(tmp_path / "dags")).dags["rendered"]
    task = dag.get_task("score")
    with pytest.raises(ValueError, match=r"StreamBatchOperator score: data_context has an unknown key 'memory_limt'\. "
                                         r"Did you mean 'memory_limit'\?"):
        task.render_template_fields({"params": {"ctx": {"memory_limt": 1}}})
        task.execute({})
    task.data_context = "{{ params.ctx }}"
    task.render_template_fields({"params": {"ctx": {"memory_limit": 1 << 30, "resources": {"CPU": 2}}}})
    task._check_arguments(rendered=True)  # a rendered string becomes the dict it spells
    assert task.data_context == {"memory_limit": 1 << 30, "resources": {"CPU": 2}}


def test_a_data_context_built_from_a_dict_at_run_time_refuses_a_typo(ctx, tmp_path):
    """The engine's side: the epoch runner (spark-submit's driver too) builds its DataContext from the
    operator's dict through the same check."""
    manifest = EpochManifest(pendulum.datetime(2026, 11, 22, 10).isoformat(),
                             pendulum.datetime(2026, 11, 22, 11).isoformat(), [])
    with pytest.raises(ValueError, match=r"DataContext has no setting 'memory_limt'\. Did you mean 'memory_limit'\?"):
        run_epoch(manifest, "pipelines:score", output_path=str(tmp_path / "out"),
                  data_context={"memory_limt": 1})
    with pytest.raises(ValueError, match=r"DataContext\.scheduling_policy must be one of"):
        DataContext.get_current().copy(scheduling_policy="fast")


def test_the_shipped_example_dags_parse_cleanly(tmp_path, monkeypatch):
    """The checks accept what the docs and the example DAGs write."""
    import pathlib

    repo = pathlib.Path(__file__).resolve().parents[2]
    errors = _parse(tmp_path / "dags", readme=textwrap.dedent('''\
        pipeline="score_pipeline:pipeline", pipeline_kwargs={"threshold": 0.7}, retries=2,
        data_context={"memory_limit": 2 << 30, "resources": {"CPU": 8, "GPU": 2}, "scheduling_policy": "conservative",
                      "execution_options": {"preserve_order": True}, "task_timeout_s": None}''').replace("\n", " "))
    assert errors == {"readme": None}
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.syspath_prepend(str(repo / "dags"))  # as Airflow does: embed_taskflow imports text_pipelines
    bag = DagBag(dag_folder=str(repo / "dags"))
    assert bag.import_errors == {} and {"embed_text_hourly", "embed_text_light",
                                                "embed_text_taskflow", "embeddings_by_hour"} <= set(bag.dag_ids)


def test_a_sensor_frontier_typo_fails_the_import_with_the_close_match(tmp_path):
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "sensed.py").write_text(textwrap.dedent('''\
        import pendulum
        from airflow.sdk import DAG
        from airflow_streambatch.sensors.epoch import EpochSensor

        with DAG("sensed", schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC")):
            EpochSensor(task_id="wait", input_path="/data/in/{{ ds }}", frontier="markr")
        '''))
    errors = _parse(folder)
    assert ("ValueError: EpochSensor wait: frontier='markr' is not one of ('marker', 'watermark', 'directory', "
            "'quiescence'). Did you mean 'marker'?") in errors["sensed"]


def test_importing_the_pipeline_in_the_task_names_what_to_fix(tmp_path, monkeypatch):
    """`load_pipeline` (execute, before Spark starts; the spark-submit mode only finds the module)."""
    from airflow_streambatch.epochs.pipeline_ref import find_pipeline_module, load_pipeline

    (tmp_path / "needs_dep.py").write_text("import no_such_dependency_xyz\n\ndef pipeline(ds, epoch):\n    return ds\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for check in (load_pipeline, find_pipeline_module):  # written from the repository root: dags.<module>
        with pytest.raises(ImportError, match=r"cannot import pipeline module 'dags\.pipelines' .*Did you mean "
                                              r"'pipelines:score'\? The DAG folder is on the worker's sys\.path"):
            check("dags.pipelines:score")
    with pytest.raises(ImportError, match=r"importing module 'needs_dep' failed: No module named "
                                          r"'no_such_dependency_xyz'\. Install what it imports"):
        load_pipeline("needs_dep:pipeline")
    with pytest.raises(ValueError, match=r"has no function 'scor'\. Did you mean 'pipelines:score'\?"):
        load_pipeline("pipelines:scor")
    assert load_pipeline("pipelines:score").__name__ == "score"
    find_pipeline_module("needs_dep:pipeline")  # found, not run: spark-submit's driver imports it
