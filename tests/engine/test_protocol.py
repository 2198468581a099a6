"""The contracts between driver and executors (`engine/protocol`): each has one encoding, and a
task spec is never edited in place, only placed (a new spec per launch)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from airflow_streambatch.engine.protocol.blocks import BlockRef
from airflow_streambatch.engine.protocol.check_ins import CheckInCall, CheckInReply
from airflow_streambatch.engine.protocol.streams import NO_GRANT_LIMIT, StreamId, StreamRecord
from airflow_streambatch.engine.protocol.tasks import Placement, TaskResult, TaskSpec


def _ref(index: int = 0) -> BlockRef:
    return BlockRef(f"0:k:{index}", f"/run/0-k-{index}.arrow", 10, 100, ("Read", "k", index), (3,), order=(3, index))


def test_a_stream_id_travels_as_its_old_wire_name_and_parses_back():
    stream = StreamId(2, "p00007", 41)
    assert str(stream) == "2-p00007-41"
    assert StreamId.parse(str(stream)) == stream
    assert StreamId.parse("0-a-b-c-9") == StreamId(0, "a-b-c", 9)  # only the ends are fixed
    ours = StreamId(2, "p00007", 41, "3f2a9c")
    assert str(ours) == "2-p00007-41@3f2a9c" and StreamId.parse(str(ours)) == ours != stream
    for bad in ("p00007", "2-41", "x-k-1", "2-p00007-41@"):
        with pytest.raises(ValueError):
            StreamId.parse(bad)


def test_check_in_messages_round_trip_through_json():
    call = CheckInCall("r1", 3, 1, 2, 7, [b"\x00result", b""])
    wire = json.loads(json.dumps(call.to_wire()))
    assert CheckInCall.from_wire(wire) == call
    assert set(wire) == {"run", "launch", "part", "attempt", "seq", "results"}
    del wire["attempt"]  # a first attempt may leave it out
    assert CheckInCall.from_wire(wire).attempt == 0
    reply = CheckInReply([b"spec-a", b"spec-b"], b"payload")
    assert CheckInReply.from_wire(json.loads(json.dumps(reply.to_wire()))) == reply
    assert CheckInReply().to_wire() == {"specs": []}  # no tasks, no payload: the partition ends
    assert CheckInReply.from_wire({"specs": []}) == CheckInReply()


def test_a_block_ref_round_trips_through_its_stream_record():
    ref = _ref(4).slice(2, 5)
    assert BlockRef.from_wire(json.loads(json.dumps(ref.to_wire()))) == ref
    with pytest.raises(KeyError):
        BlockRef.from_wire({"block_id": "x"})


def test_stream_records_keep_their_wire_form_and_refuse_what_is_none_of_them():
    ref = BlockRef("0:p1:0", "/b/0-p1-0.arrow", 3, 24, ("Op", "p1", 0), (1,))
    records = [StreamRecord.written(ref.to_wire()), StreamRecord.waiting(2, 1024), StreamRecord.finished(3)]
    wires = [json.loads(json.dumps(r.to_wire())) for r in records]
    assert wires[1:] == [{"wait": 2, "bytes": 1024}, {"done": 3}]  # what tasks of the last release sent
    assert [StreamRecord.from_wire(w).to_wire() for w in wires] == wires
    assert [StreamRecord.from_wire(w) for w in wires[1:]] == records[1:]
    assert BlockRef.from_wire(StreamRecord.from_wire(wires[0]).block) == ref
    assert StreamRecord.from_wire({"wait": 1, "bytes": -5}).nbytes == 0
    with pytest.raises(ValueError, match="not a stream record"):
        StreamRecord.from_wire({"blocks": []})


def test_a_task_spec_is_placed_not_edited():
    spec = TaskSpec("k", (3,), inputs=(_ref(0),), order=(3,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.inputs = ()  # type: ignore[misc]
    moved = dataclasses.replace(_ref(0), location="grpc+tcp://host-b:1")
    placement = Placement(gpu_ids=("1",), stream=StreamId(1, "k", 5), granted=2, allowance=64, skip_blocks=1,
                          pull=(5, 0), label="in/a.parquet")
    placed = spec.placed(placement, [moved])
    assert spec.placement == Placement() and spec.inputs == (_ref(0),)  # the spec an operator holds is untouched
    assert placed.placement == placement and placed.inputs == (moved,)
    assert spec.placement.granted == NO_GRANT_LIMIT and spec.placement.stream is None


def test_a_replay_runs_unwatched_and_writes_every_block_but_keeps_its_gpus_and_label():
    placed = TaskSpec("k", (3,)).placed(Placement(("0",), StreamId(1, "k", 5), 2, 64, 1, (5, 0), "in/a.parquet"))
    replay = placed.for_replay().placement
    assert (replay.stream, replay.granted, replay.skip_blocks, replay.pull) == (None, NO_GRANT_LIMIT, 0, None)
    assert (replay.gpu_ids, replay.label) == (("0",), "in/a.parquet")


def test_result_constructors_say_why_a_task_runs_again():
    assert TaskResult.not_run("k") == TaskResult("k", [], 0.0, 0, 0, yielded=True)
    assert TaskResult.preempted("k", 1.5, 300) == TaskResult("k", [], 1.5, 300, 0, yielded=True)
    lost = TaskResult.inputs_lost("k", ["0:a:1"])
    assert lost.lost_inputs == ["0:a:1"] and not lost.yielded and lost.error is None
