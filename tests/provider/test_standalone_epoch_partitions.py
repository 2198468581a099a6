"""Epochs as partitioned assets, and backfills of epochs, on `airflow standalone`'s own scheduler (issue 30).

One scenario over three hours of 2026-11-20, driven through the REST API the way the
UI's backfill form does it (``POST /api/v2/backfills``; "Missing and Errored Runs" is
``reprocess_behavior="failed"``):

1. a backfill of 00:00 and 01:00: 00:00 succeeds, 01:00 fails in its partition 1;
2. the failure fixed, a backfill of 00:00..02:00 with ``reprocess_behavior="failed"``
   runs only 01:00 (its failed run, cleared) and 02:00 (missing); 01:00 reruns only
   partition 1, the partitions committed by its first try stay;
3. each succeeded epoch's asset event carries its partition key, and the consumer
   DAG scheduled on the asset by partition runs once per epoch with that key;
4. Airflow's own UI, in headless Chromium (airflow_ui.py), shows the backfills, the
   producer's runs and tries, the consumer's runs by partition key and the asset's keyed
   events: the screenshots in docs/airflow.md (``STREAMBATCH_SCREENSHOTS=docs/images``).

The DAGs are in dags/epoch_partition_test_dags.py.
"""

from __future__ import annotations

import glob
import json
import re
import time
from collections import Counter
from datetime import datetime
import urllib.error

import pyarrow.parquet as pq
import pytest
from airflow_ui import UI_TIMEOUT_MS, error_screenshot, open_ui, screenshots_dir
from pipelines import partitions_run, write_inputs

PRODUCER = "sb_epoch_backfill"
CONSUMER = "sb_epoch_partition_consumer"
DAY = "2026-11-20"
HOURS = ("00", "01", "02")
PARTITIONS = 3
KEYS = {hour: f"{DAY}T{hour}:00:00" for hour in HOURS}  # the epochs' partition keys: interval start, UTC


def _at(hour: str) -> str:
    return f"{DAY}T{hour}:00:00Z"


def _until(server, what: str, ready, timeout: float = 300):
    """``ready()``'s first truthy value, polled for at most ``timeout`` s; a slow answer (the API server on a
    loaded machine while tasks start their Spark drivers) is asked again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = ready()
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            if isinstance(exc, urllib.error.HTTPError):  # an answer, not a slow server: the test's error
                raise
            value = None
        if value:
            return value
        time.sleep(2)
    raise TimeoutError(f"{what}: not after {timeout} s; see {server.log_path}")


def _backfill(server, root, from_hour: str, to_hour: str, reprocess: str) -> tuple[list[str], dict]:
    """The logical dates a dry run would create, and the finished backfill."""
    body = {"dag_id": PRODUCER, "from_date": _at(from_hour), "to_date": _at(to_hour),
            "reprocess_behavior": reprocess, "dag_run_conf": {"root": str(root)}, "max_active_runs": 1}
    dry = server.call("POST", "/backfills/dry_run", body)["backfills"]
    answers: list[int] = []
    backfill = _until(server, f"a backfill of {PRODUCER} created", lambda: _post_backfill(server, body, answers), 120)
    done = _until(server, f"backfill {backfill['id']} of {PRODUCER} completed",
                  lambda: (b := server.call("GET", f"/backfills/{backfill['id']}"))["completed_at"] and b, 600)
    return sorted(d["logical_date"].replace("+00:00", "Z") for d in dry), done


def _post_backfill(server, body: dict, answers: list[int]) -> dict | None:
    """The backfill created, or None when SQLite was locked by another writer (the DAG processor): Airflow
    answers 503, "not supported on SQLite under concurrent access". That 503 can come after the backfill
    was created (seen: 503, then 409 "already running" on the next try), so a 409 after a 503 is the
    backfill of these dates that the earlier try created. ``answers`` collects the error codes."""
    try:
        return server.call("POST", "/backfills", body)
    except urllib.error.HTTPError as exc:
        answers.append(exc.code)
        if exc.code == 409 and 503 in answers:
            return _created_backfill(server, body)
        if exc.code != 503:
            raise
        return None


def _created_backfill(server, body: dict) -> dict:
    def same(backfill: dict, key: str) -> bool:
        return datetime.fromisoformat(backfill[key]) == datetime.fromisoformat(body[key])

    backfills = server.call("GET", f"/backfills?dag_id={body['dag_id']}&limit=100")["backfills"]
    (backfill,) = [b for b in backfills if same(b, "from_date") and same(b, "to_date")
                   and b["reprocess_behavior"] == body["reprocess_behavior"]]
    return backfill


def _runs(server, dag_id: str) -> list[dict]:
    return server.call("GET", f"/dags/{dag_id}/dagRuns?limit=100")["dag_runs"]


def _producer_runs(server) -> dict[str, dict]:
    """The producer's runs by hour ("00"), each finished."""
    runs = {r["logical_date"][11:13]: r for r in _runs(server, PRODUCER)}
    assert all(r["state"] in ("success", "failed") for r in runs.values()), runs
    return runs


def _consumer_runs(server, count: int) -> list[dict]:
    """The consumer's runs once there are ``count`` finished ones."""
    def finished():
        runs = _runs(server, CONSUMER)
        return len(runs) >= count and all(r["state"] in ("success", "failed") for r in runs) and runs
    return _until(server, f"{count} finished run(s) of {CONSUMER}", finished)


def _partitions_run(root) -> dict[str, list[int]]:
    """Per hour, every partition a map task processed so far, with repeats."""
    return {hour: partitions_run(d) if (d := root / "runs" / DAY / hour).exists() else [] for hour in HOURS}


def _record(root, hour: str) -> dict:
    return json.loads((root / "out" / DAY / hour / "_epoch.json").read_text())


def _output_ids(root, hour: str) -> list[int]:
    files = glob.glob(f"{root}/out/{DAY}/{hour}/p*/*.parquet")
    return sorted(i for f in files for i in pq.read_table(f)["id"].to_pylist())


@pytest.fixture(scope="module")
def scenario(standalone, tmp_path_factory):
    standalone.wait_dags([PRODUCER, CONSUMER])
    root = tmp_path_factory.mktemp("epoch-partitions")
    for hour in HOURS:
        write_inputs(root / "in" / DAY / hour, partitions=PARTITIONS)
    (root / "fail" / DAY).mkdir(parents=True)
    (root / "fail" / DAY / "01").write_text("")  # partition 1 of 01:00 fails while this exists

    first_dry, first = _backfill(standalone, root, "00", "01", "none")
    after_first = _producer_runs(standalone)
    tries_after_first = {hour: standalone.task(PRODUCER, run["dag_run_id"], "score")["try_number"]
                         for hour, run in after_first.items()}
    consumer_after_first = _consumer_runs(standalone, 1)
    runs_after_first = _partitions_run(root)

    (root / "fail" / DAY / "01").unlink()
    second_dry, second = _backfill(standalone, root, "00", "02", "failed")
    return {"root": root, "first_dry": first_dry, "first": first, "after_first": after_first,
            "consumer_after_first": consumer_after_first, "runs_after_first": runs_after_first,
            "tries_after_first": tries_after_first,
            "second_dry": second_dry, "second": second, "after_second": _producer_runs(standalone),
            "consumer": _consumer_runs(standalone, 3)}


def test_a_backfill_of_missing_and_errored_runs_runs_only_those_epochs(standalone, scenario):
    assert scenario["first_dry"] == [_at("00"), _at("01")]
    first = scenario["after_first"]
    assert sorted(first) == ["00", "01"], "the scheduler creates no run of its own (end_date is past)"
    assert (first["00"]["state"], first["01"]["state"]) == ("success", "failed")
    assert scenario["runs_after_first"]["00"] == [0, 1, 2] and scenario["runs_after_first"]["02"] == []
    assert set(scenario["runs_after_first"]["01"]) == {0, 1, 2}  # 1 again on each of the engine's task retries

    assert scenario["second_dry"] == [_at("01"), _at("02")], "missing and errored only: 00:00 succeeded"
    runs = scenario["after_second"]
    assert sorted(runs) == list(HOURS) and all(r["state"] == "success" for r in runs.values()), runs
    assert runs["00"]["dag_run_id"] == first["00"]["dag_run_id"]
    assert runs["00"]["end_date"] == first["00"]["end_date"], "the succeeded epoch's run was not touched"
    assert runs["01"]["dag_run_id"] == first["01"]["dag_run_id"], "the failed run is cleared, not duplicated"
    tries = scenario["tries_after_first"]  # one CI run saw 1 after the clear, where local runs see 2: compare to before
    assert standalone.task(PRODUCER, runs["01"]["dag_run_id"], "score")["try_number"] == tries["01"] + 1
    assert standalone.task(PRODUCER, runs["02"]["dag_run_id"], "score")["try_number"] == 1


def test_the_failed_epoch_reruns_only_its_failed_partition(scenario):
    root = scenario["root"]
    before, after = scenario["runs_after_first"], _partitions_run(root)
    by_second_backfill = {hour: sorted((Counter(after[hour]) - Counter(before[hour])).elements()) for hour in HOURS}
    assert by_second_backfill == {"00": [], "01": [1], "02": [0, 1, 2]}, "01:00 reran partition 1 only"

    records = {hour: _record(root, hour) for hour in HOURS}
    assert {hour: (r["status"], r["tries"]) for hour, r in records.items()} == {
        "00": ("succeeded", 1), "01": ("succeeded", 2), "02": ("succeeded", 1)}
    committed_by_last_try = {hour: [p["index"] for p in r["partitions"] if p["this_try"]]
                             for hour, r in records.items()}
    assert committed_by_last_try == {"00": [0, 1, 2], "01": [1], "02": [0, 1, 2]}
    assert all(p["state"] == "committed" for r in records.values() for p in r["partitions"])
    for hour in HOURS:
        assert _output_ids(root, hour) == list(range(100 * PARTITIONS)), hour


def test_each_succeeded_epoch_runs_the_partitioned_consumer_once_with_its_key(standalone, scenario):
    first = scenario["consumer_after_first"]
    assert [r["partition_key"] for r in first] == [KEYS["00"]], "the failed epoch emitted no event"

    runs = scenario["consumer"]
    assert sorted(r["partition_key"] for r in runs) == sorted(KEYS.values()), "one run per epoch"
    assert all(r["state"] == "success" and r["run_type"] == "asset_triggered" for r in runs), runs
    for run in runs:
        key = run["partition_key"]
        events = standalone.call("GET", f"/dags/{CONSUMER}/dagRuns/{run['dag_run_id']}/upstreamAssetEvents")
        (event,) = events["asset_events"]
        assert event["partition_key"] == key and event["source_dag_id"] == PRODUCER
        hour = key[11:13]
        assert event["extra"]["interval_start"].startswith(f"{DAY}T{hour}:00:00")
        assert event["extra"]["committed_this_try"] == (1 if hour == "01" else PARTITIONS)
        xcom = standalone.call(
            "GET", f"/dags/{CONSUMER}/dagRuns/{run['dag_run_id']}/taskInstances/count_epoch_rows/xcomEntries/"
                   "return_value")
        counted = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
        assert counted == {"partition_key": key, "interval_start": event["extra"]["interval_start"],
                           "rows": 100 * PARTITIONS, "summary_rows": 100 * PARTITIONS}


def test_the_ui_shows_the_backfills_and_the_consumer_runs_by_partition_key(standalone, scenario, browser, tmp_path):
    """What a user sees of the scenario in Airflow's UI; the pictures of docs/airflow.md."""
    from playwright.sync_api import expect

    shots = screenshots_dir(tmp_path)
    producer_runs, consumer_runs = scenario["after_second"], scenario["consumer"]
    (asset,) = standalone.call("GET", "/assets?uri_pattern=partitioned-epochs")["assets"]
    page = browser.new_page(viewport={"width": 1400, "height": 640})
    try:
        with error_screenshot(page, shots / "epoch-partitions-error.png"):
            open_ui(page, standalone, f"/dags/{PRODUCER}/backfills")
            table = page.get_by_role("table")
            expect(table.locator("tbody tr"), "the two backfills").to_have_count(2, timeout=UI_TIMEOUT_MS)
            expect(table).to_contain_text("Missing and Errored Runs")
            expect(table).to_contain_text("Missing Runs")
            page.screenshot(path=str(shots / "epoch-backfills.png"))

            open_ui(page, standalone, f"/dags/{PRODUCER}/runs")
            table = page.get_by_role("table")
            expect(table.locator("tbody tr"), "one run per hour").to_have_count(3, timeout=UI_TIMEOUT_MS)
            expect(table).to_contain_text("Backfill")
            for run in producer_runs.values():
                expect(table).to_contain_text(run["dag_run_id"])

            # a backfill run's id and "Run After" name its interval's end: 01:00..02:00 is ...T02:00:00
            open_ui(page, standalone, f"/dags/{PRODUCER}/tasks/score/task_instances")
            rows = page.get_by_role("table").locator("tbody tr")
            expect(rows, "one task instance per run").to_have_count(3, timeout=UI_TIMEOUT_MS)
            cleared = scenario["tries_after_first"]["01"] + 1  # the failed epoch's try: one more than it failed on
            for hour, tries in (("01", "1"), ("02", str(cleared)), ("03", "1")):
                row = rows.filter(has_text=f"{DAY} {hour}:00:00")
                expect(row.locator("td", has_text=re.compile(f"^{tries}$")), hour).to_have_count(1)
                expect(row).to_contain_text("Success")
            page.screenshot(path=str(shots / "epoch-backfill-tries.png"))

            page.set_viewport_size({"width": 1600, "height": 640})  # the run ids and the keys side by side
            open_ui(page, standalone, f"/dags/{CONSUMER}/runs")
            table = page.get_by_role("table")
            expect(table.locator("tbody tr"), "one run per epoch").to_have_count(3, timeout=UI_TIMEOUT_MS)
            # the column is hidden by default: shown (and three others hidden, to fit) from the columns menu
            page.get_by_role("button", name="Filter table columns").click(timeout=UI_TIMEOUT_MS)
            menu = page.get_by_role("menu")
            for column in ("Partition Key", "Triggering User", "Dag Version(s)", "Conf"):
                menu.get_by_text(column, exact=True).click(timeout=UI_TIMEOUT_MS)
            page.keyboard.press("Escape")
            expect(menu).to_be_hidden()
            page.mouse.move(0, 0)  # no tooltip, no focused button keeping the table scrolled to its right
            page.evaluate("document.activeElement.blur()")
            expect(page.get_by_role("tooltip")).to_have_count(0)
            table.evaluate("t => { for (let e = t; e; e = e.parentElement) e.scrollLeft = 0; }")
            expect(page.get_by_role("columnheader", name="Partition Key")).to_be_visible()
            for run in consumer_runs:
                expect(table).to_contain_text(run["partition_key"])
            page.screenshot(path=str(shots / "epoch-partition-consumer-runs.png"))

            page.set_viewport_size({"width": 1400, "height": 900})  # the events list: all three in view
            open_ui(page, standalone, f"/assets/{asset['id']}")
            for key in KEYS.values():
                expect(page.locator("body")).to_contain_text(f"Partition Key: {key}", timeout=UI_TIMEOUT_MS)
            page.screenshot(path=str(shots / "epoch-partition-asset-events.png"))
    finally:
        page.close()
