"""StreamBatchOperator(columns=, row_filter=) under ``dag.test()`` on real local Spark (issue 33, item 4).

The epoch is one Parquet file of 8 row groups, one language each, split by the sensor into
4 ranges of two row groups; the operator keeps ``columns=["id"]`` (a template of the run's
params) and rows where ``lang == "en"``. Every batch the pipeline gets has only ``id`` and
only English rows; the two ranges the statistics rule out commit empty; a failed range is
the only one a clear reruns, and every row is committed once. Through spark-submit the
filter reaches the driver in the 0600 spec file, never on a command line.
"""

from __future__ import annotations

import glob
import json
import os

import pendulum
import pyarrow.parquet as pq
import pytest
from argv_watcher import ArgvWatcher
from pruning_data import EN_IDS, write_langs
from pruning_pipelines import take_reports

from airflow_streambatch.engine.read_pruning import decode_filter, encode_filter

LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")


def _epoch(root) -> None:
    epoch_in = root / "in" / "2026-11-22"
    epoch_in.mkdir(parents=True)
    write_langs(str(epoch_in / "langs.parquet"))
    (epoch_in / "_SUCCESS").write_text("")


def _run(dag, root, **conf) -> dict:
    conf = {"root": str(root), "columns": ["id"], "fail_from": -1, **conf}
    dr = dag.test(logical_date=LOGICAL, run_after=LOGICAL, run_conf=conf)
    return {ti.task_id: ti.state for ti in dr.get_task_instances()}


def _record(root) -> dict:
    return json.loads((root / "out" / "2026-11-22" / "_epoch.json").read_text())


def _output(root) -> tuple[list[str], list[int]]:
    tables = [pq.read_table(f) for f in sorted(glob.glob(f"{root}/out/2026-11-22/p*/*.parquet"))]
    return tables[0].column_names, sorted(i for t in tables for i in t["id"].to_pylist())


def _batches_were_pruned(reports: list[dict]) -> list[int]:
    assert reports and all(r["columns"] == ["id"] for r in reports), reports
    ids = sorted(i for r in reports for i in r["ids"])
    assert set(ids) <= set(EN_IDS)
    return ids


def test_columns_and_row_filter_prune_each_partition_and_commits_stay_exactly_once(ctx, airflow_db, tmp_path):
    from pruning_test_dags import sb_epoch_pruned

    _epoch(tmp_path)
    (tmp_path / "fail").write_text("")
    assert _run(sb_epoch_pruned, tmp_path, fail_from=1500) == {"wait_for_epoch": "success", "score": "failed"}
    record = _record(tmp_path)
    assert [p["row_groups"] for p in record["epoch"]["partitions"]] == [[0, 2], [2, 4], [4, 6], [6, 8]]
    assert [(p["state"], p.get("rows")) for p in record["partitions"][:3]] == [
        ("committed", 500), ("committed", 0), ("committed", 0)]
    assert record["partitions"][3]["state"] == "failed"
    assert "rejects ids from 1500" in record["partitions"][3]["error"]
    assert _batches_were_pruned(take_reports(tmp_path / "reports"))[:500] == list(range(500))

    (tmp_path / "fail").unlink()
    assert _run(sb_epoch_pruned, tmp_path, fail_from=1500) == {"wait_for_epoch": "success", "score": "success"}
    assert _batches_were_pruned(take_reports(tmp_path / "reports")) == list(range(1500, 2000))  # only the failed one
    record = _record(tmp_path)
    assert [(p["state"], p["rows"], p["this_try"]) for p in record["partitions"]] == [
        ("committed", 500, False), ("committed", 0, False), ("committed", 0, False), ("committed", 500, True)]
    assert _output(tmp_path) == (["id", "score"], EN_IDS)  # every English row once, nothing else


def test_the_row_filter_reaches_a_spark_submit_driver_in_its_private_spec_file(ctx, airflow_db, tmp_path,
                                                                               monkeypatch):
    from pruning_test_dags import ENGLISH, sb_epoch_pruned_spark_submit

    class SpecWatcher(ArgvWatcher):
        """Also reads the spec beside each properties file spark-submit is started with, while it exists."""

        def __init__(self, secrets):
            super().__init__(secrets)
            self.specs: dict[str, tuple[int, dict]] = {}

        def _read_properties(self, args):
            super()._read_properties(args)
            for path in self.properties:
                spec = os.path.join(os.path.dirname(path), "epoch.json")
                try:
                    with open(spec, encoding="utf-8") as f:
                        self.specs[spec] = (os.stat(spec).st_mode & 0o777, json.load(f))
                except (OSError, ValueError):
                    pass

    monkeypatch.setenv("AIRFLOW_CONN_SPARK_LOCAL", '{"conn_type": "spark", "host": "local[2]"}')
    _epoch(tmp_path)
    encoded = encode_filter(ENGLISH)
    with SpecWatcher((encoded.encode()[:32],)) as watcher:
        states = _run(sb_epoch_pruned_spark_submit, tmp_path, columns=["lang", "id"])
    assert states == {"wait_for_epoch": "success", "score": "success"}
    assert watcher.spark_submit_jvms and not watcher.leaked  # the filter is on no command line
    # this test's spec (other sessions on the machine may run spark-submit too)
    ((mode, spec),) = [found for found in watcher.specs.values() if found[1]["output_path"].startswith(str(tmp_path))]
    assert mode == 0o600 and spec["columns"] == ["lang", "id"] and decode_filter(spec["row_filter"]).equals(ENGLISH)
    record = _record(tmp_path)
    assert [p["rows"] for p in record["partitions"]] == [500, 0, 0, 500]
    assert _output(tmp_path) == (["lang", "id", "score"], EN_IDS)
    reports = take_reports(tmp_path / "reports")
    assert all(r["columns"] == ["lang", "id"] for r in reports)


def test_wrong_columns_and_row_filters_fail_when_the_dag_is_parsed():
    from airflow_streambatch.operators.streambatch import StreamBatchOperator

    args = {"pipeline": "pruning_pipelines:report_batches", "output_path": "/tmp/out", "input_path": "/tmp/in"}
    with pytest.raises(TypeError, match=r"StreamBatchOperator t: columns must be a list of column names"):
        StreamBatchOperator(task_id="t", columns="id", **args)
    with pytest.raises(TypeError, match=r"StreamBatchOperator t: row_filter must be a pyarrow.compute.Expression"):
        StreamBatchOperator(task_id="t", row_filter="lang == 'en'", **args)
    dnf = StreamBatchOperator(task_id="t", columns="{{ params.columns }}", row_filter=[("lang", "=", "en")], **args)
    assert dnf.columns == "{{ params.columns }}" and str(dnf.row_filter) == '(lang == "en")'
