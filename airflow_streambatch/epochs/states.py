"""The states of an epoch and of its input partitions, named once.

Why `enum.StrEnum`: the states are written into the durable epoch record
(``_epoch.json`` and its journal, on local disk or an object store), into XCom and
the Task State Store, and into OpenLineage facets, all as plain JSON strings. A
`StrEnum` member *is* its string (``PartitionState.COMMITTED == "committed"``,
``json.dumps`` writes ``"committed"``), so what is on disk and in Airflow's database
stays what it was and records written before these types existed load unchanged,
while the code names each state in one place and a typo is an ``AttributeError``
instead of a state nothing ever matches.
"""

from __future__ import annotations

import enum


class PartitionState(enum.StrEnum):
    """What became of one input partition of an epoch (`checkpoint.PartitionStatus.state`)."""

    PENDING = "pending"  # not finished: not run yet, or its run stopped before it committed
    COMMITTED = "committed"  # its commit record exists (by this try or an earlier one)
    FAILED = "failed"  # its last run failed; the error is in the record, a Clear reruns it


class EpochState(enum.StrEnum):
    """Where an epoch's run stands (`checkpoint.EpochRecord.status`)."""

    RUNNING = "running"  # a try is running, or its driver was killed before it could say how it ended
    SUCCEEDED = "succeeded"  # every partition committed
    FAILED = "failed"  # some partition failed or did not finish, or the run stopped (``reason`` says why)
