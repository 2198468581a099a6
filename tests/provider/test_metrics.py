"""Epoch metrics through Airflow's own StatsD client, received by a real UDP socket on 127.0.0.1.

Airflow is configured by environment variables, as a deployment would be; its stats
client is created lazily from ``[metrics]`` by the factory that `stats.initialize` sets
(Airflow's task runner calls it when a task process starts), so the fixture sets the
variables, then initializes it again the same way, and restores both afterwards.
``dag.test()`` runs the tasks in this process, on the session's real local Spark.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pendulum
import pytest
from interrupt_pipelines import tasks_started
from pipelines import write_inputs

from airflow_streambatch.operators.metrics import COUNTERS, GAUGES

LOGICAL = pendulum.datetime(2026, 11, 22, 10, tz="UTC")
STATSD_PREFIX = "sbtest"


class StatsdListener:
    """What arrived on a UDP socket, as StatsD lines (``name:value|type``) by name."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]

    def take(self) -> dict[str, list[tuple[float, str]]]:
        """Our metrics received since the last call: name -> [(value, type)] (Airflow's own are dropped)."""
        got = defaultdict(list)
        while True:
            try:
                data = self.sock.recv(65536).decode()
            except TimeoutError:
                return dict(got)
            for line in data.splitlines():  # one metric a datagram; a pipelined client would send several
                name, rest = line.split(":", 1)
                value, kind = rest.split("|")[:2]
                if name.startswith(f"{STATSD_PREFIX}.streambatch."):
                    got[name[len(STATSD_PREFIX) + 1:]].append((float(value), kind))


@pytest.fixture()
def statsd(monkeypatch):
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    listener = StatsdListener()
    settings = {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(listener.port),
                "STATSD_PREFIX": STATSD_PREFIX, "LEGACY_NAMES_ON": "True"}
    for key, value in settings.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
    try:
        yield listener
    finally:
        for key in settings:
            monkeypatch.delenv(f"AIRFLOW__METRICS__{key}")
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)  # [metrics] as it was
        listener.sock.close()


def _expected(dag_id: str, task_id: str, state: str, counters: dict, gauges: dict) -> dict:
    """Each metric under its tagged name and its name ending in the DAG's and task's ids (plain StatsD)."""
    assert set(counters) == set(COUNTERS) and set(gauges) == set(GAUGES)  # every metric docs/airflow.md lists
    out = {}
    for name, value, kind in [("epoch.finish", 1, "c"), *((n, v, "c") for n, v in counters.items()),
                              *((n, v, "g") for n, v in gauges.items())]:
        tail = f".{state}" if name == "epoch.finish" else ""
        out[f"streambatch.{name}"] = [(float(value), kind)]
        out[f"streambatch.{name}.{dag_id}.{task_id}{tail}"] = [(float(value), kind)]
    return out


def _durations(got: dict, dag_id: str, task_id: str) -> list[float]:
    tagged, named = got.pop("streambatch.epoch.duration"), got.pop(f"streambatch.epoch.duration.{dag_id}.{task_id}")
    assert [k for _, k in tagged] == ["ms"] and tagged == named
    return [v for v, _ in tagged]


def _run(dag, root, **conf) -> dict:
    conf = {"root": str(root), "fail_partitions": [], "full_recompute": False, "kill_driver_on": -1, **conf}
    dr = dag.test(logical_date=LOGICAL, run_after=LOGICAL, run_conf=conf)
    return {ti.task_id: ti.state for ti in dr.get_task_instances()}


def _committed_bytes(root, this_try: bool) -> int:
    record = json.loads((root / "out" / "2026-11-22" / "_epoch.json").read_text())
    return sum(p["bytes"] for p in record["partitions"]
               if p["state"] == "committed" and (p["this_try"] or not this_try))


def test_partial_failure_then_clear_send_exact_counts_to_statsd(ctx, airflow_db, tmp_path, statsd):
    from streambatch_test_dags import sb_epoch

    write_inputs(tmp_path / "in" / "2026-11-22", partitions=3)
    (tmp_path / "in" / "2026-11-22" / "_SUCCESS").write_text("")
    (tmp_path / "runs").mkdir()
    (tmp_path / "fail").write_text("")
    statsd.take()

    started = time.monotonic()
    assert _run(sb_epoch, tmp_path, fail_partitions=[1])["score"] == "failed"
    elapsed_ms = (time.monotonic() - started) * 1000
    got = statsd.take()
    [duration] = _durations(got, "sb_epoch", "score")
    assert 0 < duration < elapsed_ms
    # partition 1 raises on every attempt: its task runs once and is retried max_task_retries (2) times
    assert ctx.max_task_retries == 2
    bytes_now = _committed_bytes(tmp_path, this_try=True)
    assert bytes_now > 0
    assert got == _expected("sb_epoch", "score", "failed", counters={
        "partitions.committed": 2, "partitions.failed": 1, "rows.committed": 200, "bytes.committed": bytes_now,
        "rows.quarantined": 0, "task_retries": 2,
    }, gauges={
        "epoch.partitions": 3, "epoch.partitions_committed": 2, "epoch.partitions_failed": 1,
        "epoch.partitions_pending": 0, "epoch.rows": 200, "epoch.bytes": bytes_now, "epoch.rows_quarantined": 0,
    })

    (tmp_path / "fail").unlink()  # the clear: only partition 1 runs again
    assert _run(sb_epoch, tmp_path, fail_partitions=[1])["score"] == "success"
    got = statsd.take()
    _durations(got, "sb_epoch", "score")
    assert got == _expected("sb_epoch", "score", "succeeded", counters={
        "partitions.committed": 1, "partitions.failed": 0, "rows.committed": 100,
        "bytes.committed": _committed_bytes(tmp_path, this_try=True), "rows.quarantined": 0, "task_retries": 0,
    }, gauges={
        "epoch.partitions": 3, "epoch.partitions_committed": 3, "epoch.partitions_failed": 0,
        "epoch.partitions_pending": 0, "epoch.rows": 300, "epoch.bytes": _committed_bytes(tmp_path, this_try=False),
        "epoch.rows_quarantined": 0,
    })


def test_an_interrupted_epoch_on_s3_sends_what_its_record_says(ctx, airflow_db, tmp_path, s3_bucket, statsd):
    import pyarrow.fs as pafs
    from metrics_test_dags import sb_metrics_timeout_s3

    fs, bucket = pafs.FileSystem.from_uri(s3_bucket)
    write_inputs(tmp_path / "in", partitions=2)
    for name in sorted(os.listdir(tmp_path / "in")):
        with open(tmp_path / "in" / name, "rb") as src, fs.open_output_stream(f"{bucket}/in/{name}") as dst:
            dst.write(src.read())
    statsd.take()

    dr = sb_metrics_timeout_s3.test(logical_date=LOGICAL, run_after=LOGICAL,
                                    run_conf={"root": str(tmp_path), "store": s3_bucket})
    assert {ti.task_id: ti.state for ti in dr.get_task_instances()} == {"sleepy": "failed"}
    assert tasks_started(tmp_path / "started") >= 1  # interrupted while its Spark tasks ran
    got = statsd.take()
    [duration] = _durations(got, "sb_metrics_timeout_s3", "sleepy")
    assert duration >= 10_000  # the execution_timeout
    assert got == _expected("sb_metrics_timeout_s3", "sleepy", "interrupted", counters={
        "partitions.committed": 0, "partitions.failed": 0, "rows.committed": 0, "bytes.committed": 0,
        "rows.quarantined": 0, "task_retries": 0,
    }, gauges={  # from the record the stopped run saved on S3
        "epoch.partitions": 2, "epoch.partitions_committed": 0, "epoch.partitions_failed": 0,
        "epoch.partitions_pending": 2, "epoch.rows": 0, "epoch.bytes": 0, "epoch.rows_quarantined": 0,
    })


class OtlpListener(ThreadingHTTPServer):
    """An OTLP/HTTP metrics receiver on 127.0.0.1: the latest points Airflow's OpenTelemetry exporter posted,
    by name."""

    def __init__(self):
        self.points: dict[str, list[tuple[float, dict]]] = {}
        super().__init__(("127.0.0.1", 0), _OtlpHandler)


class _OtlpHandler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
            ExportMetricsServiceResponse,
        )

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportMetricsServiceRequest.FromString(body)
        exported = defaultdict(list)  # cumulative temporality: each export holds the totals so far
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        value = point.sum if kind in ("histogram", "exponential_histogram") else (
                            point.as_int if point.WhichOneof("value") == "as_int" else point.as_double)
                        attributes = {a.key: a.value.string_value for a in point.attributes}
                        exported[metric.name].append((value, attributes))
        self.server.points.update(exported)
        reply = ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def test_the_same_metrics_reach_an_opentelemetry_collector_with_their_tags(monkeypatch):
    """``otel_on``: the OTLP exporter Airflow configures posts them to the collector's endpoint."""
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils
    from airflow.sdk._shared.observability.metrics import otel_logger
    from opentelemetry import metrics

    from airflow_streambatch.epochs.checkpoint import EpochRecord, PartitionStatus
    from airflow_streambatch.operators.metrics import send

    server = OtlpListener()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings = {"AIRFLOW__METRICS__OTEL_ON": "True", "AIRFLOW__METRICS__OTEL_PREFIX": STATSD_PREFIX,
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"http://127.0.0.1:{server.server_port}/v1/metrics"}
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
    record = EpochRecord({}, "f", "/out", status="failed", partitions=[
        PartitionStatus(0, "a", "committed", rows=10, bytes=1000, this_try=True),
        PartitionStatus(1, "b", "committed", rows=20, bytes=2000),  # an earlier try's
        PartitionStatus(2, "c", "failed")], metrics={"operators": [{"tasks_retried": 2}, {"tasks_retried": 1}]})
    try:
        send("failed", record, 2.5, dag_id="dag_a", task_id="group.score")
        metrics.get_meter_provider().force_flush()
    finally:
        metrics.get_meter_provider().shutdown()
        atexit.unregister(otel_logger.flush_otel_metrics)  # Airflow's flush at exit: this provider is shut down
        server.shutdown()
        for name in settings:
            monkeypatch.delenv(name)
        stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
    tags = {"dag_id": "dag_a", "task_id": "group.score"}
    got = {name: points for name, points in server.points.items() if name.startswith(f"{STATSD_PREFIX}.streambatch.")}
    expected = {"epoch.finish": (1, {**tags, "state": "failed"}), "partitions.committed": (1, tags),
                "partitions.failed": (1, tags), "rows.committed": (10, tags), "bytes.committed": (1000, tags),
                "rows.quarantined": (0, tags), "task_retries": (3, tags), "epoch.partitions": (3, tags),
                "epoch.partitions_committed": (2, tags), "epoch.partitions_failed": (1, tags),
                "epoch.partitions_pending": (0, tags), "epoch.rows": (30, tags), "epoch.bytes": (3000, tags),
                "epoch.rows_quarantined": (0, tags), "epoch.duration": (2500.0, tags)}
    for name, (value, attributes) in expected.items():
        assert got.pop(f"{STATSD_PREFIX}.streambatch.{name}") == [(value, attributes)], name
        state = ".failed" if name == "epoch.finish" else ""
        legacy = f"{STATSD_PREFIX}.streambatch.{name}.dag_a.group__score{state}"  # '.' in an id: '__'
        assert got.pop(legacy) == [(value, {})], legacy
    assert got == {}
