"""An S3-compatible server for the object-store benchmarks (W10): moto's, started on 127.0.0.1.

`MotoServer` starts ``python -m moto.server`` on a free loopback port, points the AWS
variables of this process (and so of Spark's Python workers, started after it) at it, and
records the requests a block of code makes: moto's request recorder
(``/moto-api/recorder/...``) and its access log, which must agree. `method_of`,
`purpose_of` and `trace_line` read a recorded request; `request_latency` times one
request's round trip from the driver; `plot_requests_per_partition` draws what writes asked.
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import boto3
import pyarrow.fs as pafs

from airflow_streambatch.engine.filesystems import resolve

from benchmarks.common import Failed, timed

METHODS = ("PUT", "COPY", "POST", "GET", "HEAD", "DELETE")  # COPY: a PUT with x-amz-copy-source
_ACCESS_LINE = re.compile(r'"(?:\x1b\[[\d;]*m)*([A-Z]+) (\S+) HTTP/[\d.]+(?:\x1b\[[\d;]*m)*" (\d{3})')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """``python -m moto.server`` on a free loopback port, with its request recorder writing to
    ``recording``, its access log to ``log_path``; the AWS variables pointed at it."""

    def __init__(self, work: str, start_timeout_s: float = 60.0):
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.recording = os.path.join(work, "moto-recording.jsonl")
        self.log_path = os.path.join(work, "moto.log")
        # before Spark starts: its Python workers inherit the JVM's environment, which is this one
        os.environ.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID="streambatch-bench",
                          AWS_SECRET_ACCESS_KEY="streambatch-bench-secret", AWS_DEFAULT_REGION="us-east-1",
                          AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
        for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
            os.environ.pop(name, None)
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, "MOTO_RECORDER_FILEPATH": self.recording})
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise Failed(f"moto's S3 server did not start on port {self.port} within "
                                 f"{start_timeout_s:.0f} s; see {self.log_path}") from None
                time.sleep(0.1)

    def bucket(self, name: str) -> str:
        """A new bucket: every S3 write gets its own, because moto lists a prefix by scanning every key
        of the bucket, so keys that earlier runs left would slow this run's listings."""
        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=name)
        return f"s3://{name}"

    def api(self, action: str) -> bytes:
        method = "GET" if action == "download-recording" else "POST"
        request = urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{action}", method=method)
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.read()

    def record(self, fn):
        """(fn's result, the requests it made as recorded, the same from the access log)."""
        self.api("reset-recording")
        offset = os.path.getsize(self.log_path)
        self.api("start-recording")
        try:
            result = fn()
        finally:
            self.api("stop-recording")
        recorded = [json.loads(line) for line in self.api("download-recording").decode().splitlines() if line]
        time.sleep(0.2)  # the access log line of the last request is written as its response goes out
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            logged = [m.groups() for m in _ACCESS_LINE.finditer(f.read().decode(errors="replace"))]
        return result, recorded, [(m, p, int(s)) for m, p, s in logged if not p.startswith("/moto-api/")]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)
        self._log.close()


def method_of(entry: dict) -> str:
    headers = {k.lower() for k in entry["headers"]}
    return "COPY" if entry["method"] == "PUT" and "x-amz-copy-source" in headers else entry["method"]


def purpose_of(entry: dict) -> str:
    """What a recorded request was for, from its method, key, query and headers."""
    method, (path, _, query) = method_of(entry), entry["url"].split("://", 1)[-1].partition("/")[2].partition("?")
    rules = [(method == "COPY", "copy staged file to final name (CopyObject)"),
             (path.endswith("/_commit.json"), f"commit record ({method}, conditional create)"),
             (path.endswith(("/_lease", "/_write.json")) or "/_driver" in path, "lease, _write.json, _driver"),
             ("uploads" in query or "uploadId" in query, "multipart upload (start, part, complete)"),
             (method == "PUT" and path.endswith("/"), "directory marker"),
             (method == "GET" and "list-type" in query, "list"),
             (method == "POST" and "delete" in query, "batch delete (DeleteObjects)"),
             (method == "HEAD", "head (exists? / bucket probe)"), (method == "DELETE", "delete (directory marker)")]
    return next((purpose for matched, purpose in rules if matched), f"other {method}")


def trace_line(entry: dict) -> str:
    where = re.sub(r"uploadId=[^&]+", "uploadId=...", entry["url"].split("://", 1)[-1].partition("/")[2])
    return f"{method_of(entry)} {where}"


def request_latency(server: MotoServer, bucket: str, calls: int = 100) -> dict:
    """The round trip of one request from the driver, in ``bucket`` as it is (median of ``calls``):
    a HEAD (pyarrow's ``get_file_info`` of an object) and a prefix listing that matches nothing
    (as when a partition's staging is deleted); requests per call counted from the recording."""
    fs, key = resolve(f"{bucket}/_probe/object")
    with fs.open_output_stream(key) as f:
        f.write(b"x")
    pages = boto3.client("s3", endpoint_url=server.endpoint).get_paginator("list_objects_v2")
    figures = {"keys_in_bucket": sum(page["KeyCount"] for page in pages.paginate(Bucket=key.split("/", 1)[0])),
               "calls": calls}
    for name, call in (("head", lambda: fs.get_file_info(key)),
                       ("list", lambda: fs.get_file_info(pafs.FileSelector(f"{key}-none", allow_not_found=True)))):
        times, recorded, _ = server.record(lambda: [timed(call)[0] for _ in range(calls)])  # noqa: B023
        figures[f"{name}_ms"] = 1000 * statistics.median(times)
        figures[f"{name}_requests_per_call"] = len(recorded) / calls
    return figures


def plot_requests_per_partition(ax, labels: list[str], writes: list[dict]) -> None:
    """A stacked bar per recorded write: its requests per partition by method (``by_method``, ``partitions``)."""
    bottom = [0.0] * len(writes)
    for m in METHODS:
        values = [w["by_method"][m] / w["partitions"] for w in writes]
        ax.bar(labels, values, bottom=bottom, label=m)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("S3 requests per partition (recorded write)")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
