"""The epoch view in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright with ``executable_path``; nothing downloaded) against `airflow standalone`.

What a user does: trigger an epoch whose pipeline fails on two of four partitions, open
the task instance's "Epoch" tab, read which partitions failed and why, remove the cause,
press the UI's Clear button and confirm, and see in the view (and in the pipeline's own
log of what it processed) that only those two partitions ran again.

Screenshots go to ``$STREAMBATCH_SCREENSHOTS`` (docs/images/ when refreshing the docs'
pictures), else to the test's tmp dir; the browser and these helpers are in airflow_ui.py.
"""

from __future__ import annotations

import contextlib
import json
import time
from urllib.parse import quote

from airflow_ui import UI_TIMEOUT_MS, open_ui, screenshots_dir
from pipelines import partitions_run, take_partitions_run, write_inputs

DAY = "2026-11-21"  # not test_standalone.py's: one run per logical date and DAG
INTERVAL = {"logical_date": f"{DAY}T10:00:00Z", "data_interval_start": f"{DAY}T10:00:00Z",
            "data_interval_end": f"{DAY}T11:00:00Z"}
CLEAR_BUTTON = "Press shift+c to clear"  # the task instance header's Clear button (its accessible name)


def _wait(what: str, ready, timeout: float, server) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(1)
    raise TimeoutError(f"{what}: not after {timeout} s; see {server.log_path}")


def _task(server, run_id: str) -> dict:
    return server.task("sb_epoch", quote(run_id, safe=""), "score")


def _open_epoch_tab(page, server, run_id: str):
    """The task instance page, then its "Epoch" tab; the view's iframe."""
    open_ui(page, server, f"/dags/sb_epoch/runs/{quote(run_id, safe='')}/tasks/score")
    page.get_by_text("Epoch", exact=True).click(timeout=UI_TIMEOUT_MS)
    frame = page.frame_locator("iframe[title='Epoch']")
    frame.locator("h1").wait_for(timeout=UI_TIMEOUT_MS)  # the plugin answered (not an error page)
    return frame


def _rows(frame, table: str):
    return frame.locator(f"#{table} tr.partition")


def test_the_epoch_tab_lists_failed_partitions_and_a_ui_clear_reruns_only_them(standalone, browser, tmp_path):
    from playwright.sync_api import expect

    standalone.wait_dags(["sb_epoch"])
    shots = screenshots_dir(tmp_path)
    write_inputs(tmp_path / "in" / DAY, partitions=4)
    (tmp_path / "in" / DAY / "_SUCCESS").write_text("")
    (tmp_path / "runs").mkdir()
    (tmp_path / "fail").write_text("")
    body = {**INTERVAL, "conf": {"root": str(tmp_path), "fail_partitions": [1, 3]}}
    run_id = standalone.call("POST", "/dags/sb_epoch/dagRuns", body)["dag_run_id"]

    page = browser.new_page(viewport={"width": 1400, "height": 1250})
    try:
        # while the epoch runs: the view reloads itself; catch it if the machine is slow enough to
        _wait("score running or done", lambda: _task(standalone, run_id)["state"] in ("running", "failed", "success"),
              240, standalone)
        if _task(standalone, run_id)["state"] == "running":
            frame = _open_epoch_tab(page, standalone, run_id)
            if frame.locator("#task-state").inner_text(timeout=UI_TIMEOUT_MS) == "running":
                page.screenshot(path=str(shots / "epoch-view-starting.png"))
            # the page reloads itself every few seconds: catch the running epoch, ideally after its first commit
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and _task(standalone, run_id)["state"] == "running":
                with contextlib.suppress(Exception):  # a reload in between: look again
                    status = frame.locator("#epoch-status").inner_text(timeout=1000)
                    if status == "running" and frame.locator("#progress").count():
                        page.screenshot(path=str(shots / "epoch-view-running.png"))
                        if int(frame.locator("#progress").get_attribute("aria-valuenow", timeout=1000)) > 0:
                            break
                time.sleep(0.5)

        assert standalone.wait_run("sb_epoch", quote(run_id, safe="")) == "failed"
        assert set(take_partitions_run(tmp_path / "runs")) == {0, 1, 2, 3}
        frame = _open_epoch_tab(page, standalone, run_id)
        failed = _rows(frame, "failed-partitions")
        expect(failed, "the view lists the two failed partitions").to_have_count(2, timeout=UI_TIMEOUT_MS)
        for row, index in zip(failed.all(), (1, 3)):
            text = row.inner_text()
            assert f"part-{index:03d}.parquet" in text and f"scorer rejects partition(s) [{index}]" in text, text
            traceback = frame.locator(f"#failed-partitions tr.traceback[data-index='{index}'] details")
            expect(traceback.locator("pre")).not_to_be_visible()  # collapsed until asked for
            traceback.locator("summary").click()
            expect(traceback.locator("pre")).to_contain_text("Traceback (most recent call last)")
            expect(traceback.locator("pre")).to_contain_text(f"scorer rejects partition(s) [{index}]")
            traceback.locator("summary").click()
            expect(traceback.locator("pre")).not_to_be_visible()
        expect(_rows(frame, "committed-partitions")).to_have_count(2)
        expect(frame.locator("#clear-hint")).to_contain_text("Clear this task to rerun 2 partitions")
        expect(frame.locator("#output-path")).to_have_text(f"file://{tmp_path}/out/{DAY}")
        frame.locator("#failed-partitions tr.traceback[data-index='1'] summary").click()  # shown: one open
        page.screenshot(path=str(shots / "epoch-view-failed.png"))

        # the cause is fixed; the user presses Clear and confirms in the dialog
        (tmp_path / "fail").unlink()
        page.get_by_role("button", name=CLEAR_BUTTON).click(timeout=UI_TIMEOUT_MS)
        dialog = page.get_by_role("dialog")
        expect(dialog, "the Clear dialog opens").to_contain_text("Clear Task Instance", timeout=UI_TIMEOUT_MS)
        dialog.get_by_role("button", name="Confirm").click(timeout=UI_TIMEOUT_MS)
        expect(dialog, "the Clear dialog closes once confirmed").to_have_count(0, timeout=UI_TIMEOUT_MS)
        _wait("the clear to start try 2", lambda: _task(standalone, run_id)["try_number"] == 2, 120, standalone)
        assert standalone.wait_run("sb_epoch", quote(run_id, safe="")) == "success"

        ti = _task(standalone, run_id)
        assert ti["state"] == "success" and ti["try_number"] == 2
        assert partitions_run(tmp_path / "runs") == [1, 3]  # the pipeline's side: only the two failed ones ran
        frame = _open_epoch_tab(page, standalone, run_id)
        expect(frame.locator("#progress-text")).to_contain_text("4 of 4 partitions committed (2 by this try)")
        expect(_rows(frame, "failed-partitions")).to_have_count(0)
        expect(_rows(frame, "committed-partitions")).to_have_count(4)
        rerun = frame.locator("#committed-partitions tr[data-this-try='true']")
        assert [int(i) for i in rerun.evaluate_all("rows => rows.map(r => r.dataset.index)")] == [1, 3]
        expect(frame.locator("#clear-hint")).to_have_count(0)
        page.screenshot(path=str(shots / "epoch-view-after-clear.png"))
    except Exception:
        with contextlib.suppress(Exception):  # what the browser showed when it failed, for the CI log reader
            page.screenshot(path=str(shots / "epoch-view-error.png"))
        raise
    finally:
        page.close()
    record = json.loads((tmp_path / "out" / DAY / "_epoch.json").read_text())  # what the view read
    assert record["status"] == "succeeded" and [p["this_try"] for p in record["partitions"]] == [False, True, False,
                                                                                                 True]
