"""Task pulling: a Spark partition that ran its tasks asks the driver for more instead of ending.

A Spark job costs about 100 ms here before any task code runs (a Python job of four empty
partitions: 95-130 ms median, against 28 ms for the same job in the JVM alone), so tasks
of 10 ms paid ten times their work when each job ran a fixed group (W2: 22.5 ms of
overhead per task). A partition that finished its group checks in: it sends its tasks'
results and gets the next tasks of the operator the scheduler gives this slot to, when
that operator asks for the resources Spark placed the partition by (with the operator's
payload when it changes), or none, and its Spark partition ends. One Spark job then runs
as long as there is work for its slots, and a task costs one call to the driver.

The scheduler loop answers (it owns every piece of state a task touches); the control
server's thread only carries the call. A check-in the loop has not answered within
``CHECK_IN_WAIT_S`` is abandoned: the partition ends, so a loop busy rebuilding a lost block
by lineage (a Spark job that needs a slot) never waits on partitions that hold every slot.
Calls are numbered per partition: a call repeated because its answer was lost gets the
same answer, so no result is delivered twice and no task handed out twice. A partition
Spark runs again after its executor died runs none of its tasks: it checks in with
none, the driver reruns the tasks the lost attempt had, and hands it new ones.

A partition that checks in when no task is ready, while the run is not done, waits a
little (``Parked``, at most ``LINGER_S``) before it ends: the next block of a model a few
hundred milliseconds away would otherwise cost a new Spark job, ~100 ms here and a second
on a cluster, for a task of a few milliseconds (a writer behind a model paid two jobs per
block). A parked partition ends at once when a task of another kind of slot is ready, so
Spark gets the slot back for it.

A job's partitions stop pulling after ``MAX_JOB_S``: until a partition ends, Spark has no
slot to give a partition it reruns, nor another job of the application (FAIR pools share
slots only as tasks end), so recovery and fairness would wait for the run to run dry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from airflow_streambatch.engine.protocol.check_ins import CHECK_IN_WAIT_S, CheckInCall, CheckInReply

MAX_JOB_S = 5.0  # a job's partitions get no more tasks after this long: Spark's scheduler gets their slots back
LINGER_S = 0.3  # the longest a partition that found no ready task waits for one before it ends


class CheckIn:
    """One call of a Spark partition: the results of the tasks it ran, waiting for an answer."""

    def __init__(self, launch_id: int, part: int, attempt: int, results: list[bytes]):
        self.launch_id = launch_id
        self.part = part
        self.attempt = attempt  # Spark's attempt of the partition: a later one means Spark lost and reran it
        self.results = results
        self._lock = threading.Lock()
        self._answered = threading.Event()
        self._specs: list[bytes] | None = None
        self._payload: bytes | None = None
        self._abandoned = False

    @classmethod
    def of(cls, call: CheckInCall) -> CheckIn:
        """The call as the scheduler loop takes it (`launcher.Launcher.check_in`)."""
        return cls(call.launch, call.part, call.attempt, call.results)

    def answer(self, specs: list[bytes], payload: bytes | None = None) -> bool:
        """Hand ``specs`` (pickled `TaskSpec`s) to the partition, with their operator's payload
        when it is not the one the partition ran until now; False when it stopped waiting."""
        with self._lock:
            if self._abandoned:
                return False
            self._specs, self._payload = specs, payload
        self._answered.set()
        return True

    def wait(self, timeout_s: float) -> CheckInReply:
        """The answer, or no tasks (the partition ends) when the loop gives none in ``timeout_s``."""
        self._answered.wait(timeout_s)
        with self._lock:
            if self._specs is None:
                self._abandoned = True
            return CheckInReply(list(self._specs or []), self._payload)


class Parked:
    """Check-ins of partitions that found no ready task, each waiting for one until its deadline."""

    def __init__(self):
        self._waiting: list[tuple[CheckIn, float]] = []

    def park(self, check_in: CheckIn, until: float) -> None:
        self._waiting.append((check_in, until))

    def take(self) -> list[tuple[CheckIn, float]]:
        """Every parked check-in with its deadline; those not served are parked again."""
        waiting, self._waiting = self._waiting, []
        return waiting

    def release_all(self) -> None:
        """The run ends or stops: every parked partition ends."""
        for check_in, _ in self.take():
            check_in.answer([])


class CheckInDesk:
    """The control server's side: routes each run's check-ins to its scheduler loop."""

    def __init__(self):
        self._lock = threading.Lock()
        self._runs: dict[str, Callable[[CheckIn], None]] = {}
        self._last: dict[tuple, tuple[int, CheckIn]] = {}  # (run, launch, part, attempt) -> its last call

    def open(self, run_id: str, deliver: Callable[[CheckIn], None]) -> None:
        with self._lock:
            self._runs[run_id] = deliver

    def close(self, run_id: str) -> None:
        with self._lock:
            self._runs.pop(run_id, None)
            for key in [key for key in self._last if key[0] == run_id]:
                del self._last[key]

    def check_in(self, body: dict) -> dict:
        """The control server's handler: a partition's `CheckInCall` in, its `CheckInReply` out (wire form)."""
        call = CheckInCall.from_wire(body)
        key = call.key
        with self._lock:
            deliver = self._runs.get(call.run)
            if deliver is None:  # the run ended: the partition ends too
                return CheckInReply().to_wire()
            last_seq, check_in = self._last.get(key, (-1, None))
            new = call.seq > last_seq
            if new:
                check_in = CheckIn.of(call)
                self._last[key] = (call.seq, check_in)
            elif call.seq < last_seq or check_in is None:
                return CheckInReply().to_wire()  # an old call arriving late: its answer was given already
        if new:
            deliver(check_in)
        return check_in.wait(CHECK_IN_WAIT_S).to_wire()
