"""The contracts between the driver and the code that runs on Spark executors.

Why a layer of its own: the driver (`engine/execution`, `engine/spark`, `engine/plan`) and the
executors (`engine/worker`) exchange block references, task specs and results, check-in
messages, stream ids and staged-file records. When these lived in `engine/worker`, the driver
imported executor code to name them, and each message was a string-keyed dict built on one
side and parsed on the other. Here each contract is a type, in one place, with its one
encoding; both sides import it, and it imports neither (`tests/test_import_boundaries.py`).

* `blocks`: `BlockRef`, what the driver holds instead of data;
* `tasks`: `TaskSpec` (frozen) and its `Placement` (what a launch assigns at hand-out),
  `OperatorPayload`, `TaskResult`;
* `check_ins`: a partition's `CheckInCall` and the driver's `CheckInReply`;
* `streams`: `StreamId`, and the grant values both sides read (`NO_GRANT_LIMIT`, `YIELD`);
* `control`: `ControlInfo`, how tasks reach the driver's control plane;
* `staging`: where sink tasks stage files and what they report (`StagedFile`);
* `backend`: what the scheduler loop needs of whatever runs its jobs (`Backend`, `JobOutcome`).
"""
