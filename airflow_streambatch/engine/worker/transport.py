"""Reading a block wherever it lives, and removing it there.

Blocks stay on the host that wrote them (tmpfs or local disk). A reader on the same
host memory-maps the file, as in local mode; a reader on another host (a consumer
task, or the driver) fetches it from the block server of the host that holds it
(`host_agent.py`) with Arrow Flight ``do_get``, which streams the IPC batches
without re-encoding them. A block whose host is gone, or whose file is gone, raises
`BlockLostError`, and the driver rebuilds it by lineage.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.flight as flight

from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.control import ControlInfo
from airflow_streambatch.engine.worker.blocks import read_block
from airflow_streambatch.engine.worker.control_client import client


class BlockLostError(FileNotFoundError):
    """A block's file is gone, or its host cannot be reached: rebuild it by lineage."""


def read_any(ref: BlockRef, control: ControlInfo | None) -> tuple[pa.Table, int]:
    """The rows ``ref`` covers, and how many bytes crossed the network to get them."""
    if os.path.exists(ref.path):
        return read_block(ref), 0
    if not ref.location or control is None:
        raise BlockLostError(f"block {ref.block_id} ({ref.path}) is not on this host and no host serves it")
    ticket = flight.Ticket(json.dumps({"token": control.token, "path": ref.path}).encode())
    options = flight.FlightCallOptions(timeout=control.timeout_s)
    try:
        table = client(ref.location, control.tls_roots).do_get(ticket, options=options).read_all()
    except (flight.FlightError, OSError) as exc:
        raise BlockLostError(f"block {ref.block_id} could not be fetched from {ref.location}: "
                             f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    moved = table.nbytes
    if ref.offset or ref.length is not None:
        table = table.slice(ref.offset, ref.length if ref.length is not None else table.num_rows - ref.offset)
    return table, moved


def delete_blocks(location: str, paths: list[str], control: ControlInfo) -> bool:
    """Remove block files on the host that ``location`` serves; ``False`` when it did not answer
    (a host that is gone took them with it, and an agent removes an ended run's directory anyway)."""
    body = json.dumps({"token": control.token, "paths": paths}).encode()
    try:
        options = flight.FlightCallOptions(timeout=10)
        list(client(location, control.tls_roots).do_action(flight.Action("delete", body), options=options))
    except (flight.FlightUnavailableError, flight.FlightTimedOutError):
        return False
    except flight.FlightError:
        pass  # it answered, refusing a path: nothing more to do for these
    return True
