"""One look at an epoch's inputs: has the frontier passed, and if so, what is the manifest?

Shared by the sensor's pokes and its trigger's polls, so both freeze the same way.
"""

from __future__ import annotations

from datetime import datetime

from airflow_streambatch.epochs.frontier import Quiescence
from airflow_streambatch.epochs.manifest import EpochManifest, list_inputs


def epoch_interval(context) -> tuple[str, str]:
    """An Airflow task context's data interval as ISO strings: the epoch the sensor and the operator
    work on. A run without one (manual, no logical date) is the single epoch ending at its run_after."""
    end = context.get("data_interval_end") or context["dag_run"].run_after
    start = context.get("data_interval_start") or end
    return start.isoformat(), end.isoformat()


def _listing(inputs) -> dict:
    return {p.path: [p.size, p.mtime] for p in inputs}


def check_epoch(frontier, input_path: str, interval_start: str, interval_end: str, state: dict | None,
                now: float) -> tuple[EpochManifest | None, dict | None]:
    """(the frozen manifest, or None while the frontier has not passed ``interval_end``; state to keep).

    ``interval_*`` are ISO-8601 strings (they travel through a trigger's JSON). The
    manifest is listed after the frontier passed, since a producer writes its files
    before its marker; for quiescence, whose frontier is the listing itself, a listing
    that changed in between restarts the quiet period.
    """
    listing = _listing(list_inputs(input_path, missing_ok=True))
    passed, state = frontier.poll(datetime.fromisoformat(interval_end), listing, state, now)
    if not passed:
        return None, state
    inputs = list_inputs(input_path, missing_ok=True)
    if isinstance(frontier, Quiescence) and _listing(inputs) != listing:
        return None, frontier.observe(None, _listing(inputs), now)[1]
    return EpochManifest(interval_start, interval_end, inputs), state
