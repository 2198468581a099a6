"""OpenLineage events of an epoch, emitted by the real ``apache-airflow-providers-openlineage`` listener.

``sb_epoch`` (sensor -> operator, real local Spark) runs under ``dag.test()`` in a process
of its own (`openlineage_runs.py`) configured, as users configure it, by the environment:
a file transport, and ``spark_inject_parent_job_info``. The first run fails partitions 1
and 3, the second (the Clear) reruns only those. The events the listener wrote to the
file are what a lineage backend would receive.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from pipelines import write_inputs

RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openlineage_runs.py")
DAGS = os.path.join(os.path.dirname(RUNS), "dags")
NAMESPACE = "streambatch-tests"


def _events(path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _job_events(events, job) -> list[dict]:
    return [e for e in events if e["job"]["name"] == job and e["job"]["namespace"] == NAMESPACE]


def _output(event) -> tuple[str, str, dict]:
    (out,) = event["outputs"]
    return out["namespace"], out["name"], out.get("outputFacets", {}).get("outputStatistics", {})


@pytest.fixture(scope="module")
def lineage_runs(airflow_db, tmp_path_factory):
    """Both runs, once: (root, events, what openlineage_runs.py reported of each run)."""
    root = tmp_path_factory.mktemp("openlineage")
    write_inputs(root / "in" / "2026-11-22", partitions=4)
    (root / "in" / "2026-11-22" / "_SUCCESS").write_text("")
    (root / "runs").mkdir()
    (root / "fail").write_text("")
    events, report = root / "events.jsonl", root / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__OPENLINEAGE__", "OPENLINEAGE_"))}
    env.update(AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps({"type": "file", "log_file_path": str(events),
                                                          "append": True}),
               AIRFLOW__OPENLINEAGE__NAMESPACE=NAMESPACE, AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO="true",
               PYTHONPATH=os.pathsep.join([DAGS, env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, RUNS, str(root), str(report)], env=env, capture_output=True, text=True,
                          timeout=420)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return root, _events(events), json.loads(report.read_text())


def test_the_runs_fail_then_the_clear_succeeds(lineage_runs):
    _, _, report = lineage_runs
    assert [r["states"] for r in report] == [{"wait_for_epoch": "success", "score": "failed"},
                                             {"wait_for_epoch": "success", "score": "success"}]


def test_the_sensor_names_the_frozen_files_and_the_epoch(lineage_runs):
    root, events, _ = lineage_runs
    sensor = _job_events(events, "sb_epoch.wait_for_epoch")
    assert [e["eventType"] for e in sensor] == ["START", "COMPLETE", "START", "COMPLETE"]
    files = [str(root / "in" / "2026-11-22" / f"part-{i:03d}.parquet") for i in range(4)]
    start, complete = sensor[:2]
    assert [(d["namespace"], d["name"]) for d in start["inputs"]] == [("file", str(root / "in" / "2026-11-22"))]
    assert [(d["namespace"], d["name"]) for d in complete["inputs"]] == [("file", f) for f in files]
    facet = complete["run"]["facets"]["streambatch_epoch"]
    assert facet["partitions"] == 4 and len(facet["fingerprint"]) == 16
    assert facet["interval_start"] == "2026-11-22T10:00:00+00:00"


def test_the_failed_try_says_what_it_read_wrote_and_which_partitions_failed(lineage_runs):
    root, events, _ = lineage_runs
    score = _job_events(events, "sb_epoch.score")
    assert [e["eventType"] for e in score] == ["START", "FAIL", "START", "COMPLETE"]
    out_dir = str(root / "out" / "2026-11-22")
    assert _output(score[0])[:2] == ("file", out_dir)  # known before execute: the rendered output_path
    fail = score[1]
    files = [str(root / "in" / "2026-11-22" / f"part-{i:03d}.parquet") for i in range(4)]
    assert [(d["namespace"], d["name"]) for d in fail["inputs"]] == [("file", f) for f in files]
    record = json.loads((root / "out" / "2026-11-22" / "_epoch.json").read_text())  # the final one (after the clear)
    namespace, name, stats = _output(fail)
    assert (namespace, name) == ("file", out_dir)
    # partitions 0 and 2 were committed by this try; the clear did not touch them
    kept = [record["partitions"][i] for i in (0, 2)]
    assert stats == {**stats, "rowCount": 200, "size": sum(p["bytes"] for p in kept),
                     "fileCount": sum(len(p["files"]) for p in kept)}
    facet = fail["run"]["facets"]["streambatch_epoch"]
    assert facet["status"] == "failed" and facet["try_number"] == 1 and facet["fingerprint"] == record["fingerprint"]
    assert facet["counts"] == {"committed": 2, "committed_this_try": 2, "failed": 2, "pending": 0}
    states = facet["partition_states"]
    assert [(p["index"], p["state"]) for p in states] == [(0, "committed"), (1, "failed"), (2, "committed"),
                                                          (3, "failed")]
    assert "scorer rejects partition(s) [1]" in states[1]["error"] and states[1]["path"] == files[1]
    assert [states[i]["committing_try"] for i in (0, 2)] == [1, 1]
    assert facet["partitions_left_out"] == 0
    assert "errorMessage" in fail["run"]["facets"]


def test_the_clear_completes_with_only_the_failed_partitions_on_the_new_try(lineage_runs):
    root, events, _ = lineage_runs
    complete = _job_events(events, "sb_epoch.score")[3]
    record = json.loads((root / "out" / "2026-11-22" / "_epoch.json").read_text())
    _, _, stats = _output(complete)
    rerun = [record["partitions"][i] for i in (1, 3)]
    assert stats == {**stats, "rowCount": 200, "size": sum(p["bytes"] for p in rerun),
                     "fileCount": sum(len(p["files"]) for p in rerun)}
    facet = complete["run"]["facets"]["streambatch_epoch"]
    assert facet["status"] == "succeeded" and facet["try_number"] == 2
    assert facet["counts"] == {"committed": 4, "committed_this_try": 2, "failed": 0, "pending": 0}
    states = facet["partition_states"]
    assert [p["state"] for p in states] == ["committed"] * 4
    assert [p["committed_by_this_try"] for p in states] == [False, True, False, True]
    assert [p.get("committing_try") for p in states] == [None, 2, None, 2]
    assert states[0]["run_id"] == states[2]["run_id"] != states[1]["run_id"] == states[3]["run_id"]


def test_the_spark_application_gets_the_task_as_its_parent_job(lineage_runs):
    _, events, report = lineage_runs
    fail = _job_events(events, "sb_epoch.score")[1]
    dag_run = [e for e in _job_events(events, "sb_epoch") if e["eventType"] == "FAIL"][0]
    spark = report[0]["spark_openlineage"]
    assert spark["spark.openlineage.parentJobNamespace"] == NAMESPACE
    assert spark["spark.openlineage.parentJobName"] == "sb_epoch.score"
    assert spark["spark.openlineage.parentRunId"] == fail["run"]["runId"]
    assert spark["spark.openlineage.rootParentJobName"] == "sb_epoch"
    assert spark["spark.openlineage.rootParentRunId"] == dag_run["run"]["runId"]


def test_an_epoch_facet_stays_bounded_failed_partitions_first():
    from airflow_streambatch.epochs.checkpoint import EpochRecord
    from airflow_streambatch.epochs.manifest import EpochManifest, InputPartition
    from airflow_streambatch.operators.lineage import (
        MAX_INPUT_DATASETS,
        MAX_PARTITIONS_SHOWN,
        epoch_facet,
        input_datasets,
    )

    n = 5000
    manifest = EpochManifest("2026-11-22T00:00:00+00:00", "2026-11-23T00:00:00+00:00",
                             [InputPartition(f"s3://bucket/in/d{i // 1000}/f{i}.parquet", 10) for i in range(n)])
    record = EpochRecord.start(manifest, "s3://bucket/out/2026-11-22")
    record.tries = 3
    for p in record.partitions:
        p.state, p.this_try = ("failed", False) if p.index in (7, 4321) else ("committed", p.index % 2 == 0)
    facet = epoch_facet(manifest, record=record)
    assert len(facet.partition_states) == MAX_PARTITIONS_SHOWN and facet.partitions_left_out == n - MAX_PARTITIONS_SHOWN
    assert {p["index"] for p in facet.partition_states} >= {7, 4321}  # failures first, then committed ones
    assert facet.counts == {"committed": n - 2, "committed_this_try": n // 2, "failed": 2, "pending": 0}
    assert len(json.dumps(facet.partition_states)) < 32_000
    inputs = input_datasets(manifest)  # over MAX_INPUT_DATASETS files: their directories
    assert n > MAX_INPUT_DATASETS
    assert [(d.namespace, d.name) for d in inputs] == [("s3://bucket", f"in/d{i}") for i in range(5)]


@pytest.mark.parametrize(("location", "expected"), [
    ("s3://bucket/out/2026-11-22/", ("s3://bucket", "out/2026-11-22")),
    ("s3a://bucket/k.parquet", ("s3://bucket", "k.parquet")),
    ("gs://b/x/y", ("gs://b", "x/y")),
    ("/data/out/", ("file", "/data/out")),
    ("file:///data/in/a.csv", ("file", "/data/in/a.csv")),
    ("hdfs://nn:8020/warehouse/t", ("hdfs://nn:8020", "/warehouse/t")),
])
def test_dataset_names_follow_the_openlineage_naming_spec(location, expected):
    from airflow_streambatch.operators.lineage import dataset_name

    assert dataset_name(location) == expected


def test_an_injected_transport_secret_is_redacted_like_the_store_credentials():
    """``spark_inject_transport_info`` puts an HTTP transport's API key into the Spark properties: the hook's
    redaction (Spark UI, event log) and Airflow's log masking must cover it; the parent-job ids are not secret."""
    from airflow_streambatch.hooks.spark_properties import SENSITIVE

    sensitive = re.compile(SENSITIVE)
    assert sensitive.search("spark.openlineage.transport.auth.apiKey")
    assert sensitive.search("spark.openlineage.transport.headers.Authorization")
    assert not sensitive.search("spark.openlineage.parentRunId")
