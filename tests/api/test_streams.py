"""CommandStreams: lifecycle validation, bounds, deadlines, failover and client close."""

from __future__ import annotations

import asyncio

import pytest

from skulk.api.errors import Overloaded, StreamFailed
from skulk.api.streams import CommandStreams, check_frame
from skulk.shared.types.chunks import (
    ErrorChunk,
    ResultChunk,
    StreamPayload,
    StreamStarted,
    StreamTerminal,
    TokenChunk,
)
from skulk.shared.types.workload_io import EmbeddingResult
from tests.api.test_openai_routes import HANG_GUARD_S

CID = "c1"


def started(cid: str = CID) -> StreamStarted:
    return StreamStarted(command_id=cid, runner_id="r1")


def payload(seq: int, text: str = "x", cid: str = CID) -> StreamPayload:
    return StreamPayload(command_id=cid, seq=seq, chunk=TokenChunk(command_id=cid, text=text))


def error_payload(seq: int, cid: str = CID) -> StreamPayload:
    return StreamPayload(command_id=cid, seq=seq, chunk=ErrorChunk(command_id=cid, error_type="OutOfMemory", message="oom"))


def terminal(seq: int, outcome: str = "completed", cid: str = CID, **kw) -> StreamTerminal:
    return StreamTerminal(command_id=cid, seq=seq, outcome=outcome, **kw)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def drain(stream) -> tuple[list[str], StreamFailed | None]:
    texts = []
    try:
        async for chunk in stream:
            texts.append(chunk.text)
    except StreamFailed as failure:
        return texts, failure
    return texts, None


async def run(frames, **options) -> tuple[list[str], StreamFailed | None, CommandStreams]:
    streams = CommandStreams(**options)
    stream = streams.open(CID)
    for frame in frames:
        streams.deliver(frame)
    texts, failure = await asyncio.wait_for(drain(stream), timeout=HANG_GUARD_S)
    return texts, failure, streams


@pytest.mark.parametrize(
    ("next_seq", "frame", "problem"),
    [
        (None, started(), None),
        (1, started(), "duplicate StreamStarted"),
        (None, payload(1), "payload seq 1 before StreamStarted"),
        (1, payload(1), None),
        (1, payload(2), "payload seq 2, expected 1"),
        (3, payload(2), "payload seq 2, expected 3"),
        (None, terminal(0, "failed", error_type="E"), "terminal seq 0 before StreamStarted"),
        (3, terminal(3), None),
        (3, terminal(4), "terminal seq 4, expected 3"),
    ],
)
def test_check_frame(next_seq, frame, problem):
    assert check_frame(next_seq, frame) == problem


# (frames, texts the client reads, error type of the end or None for completed, violations)
LIFECYCLES = {
    "completed": ([started(), payload(1, "a"), payload(2, "b"), terminal(3)], ["a", "b"], None, 0),
    "completed-empty": ([started(), terminal(1)], [], None, 0),
    "payload-before-started": ([payload(1, "a")], [], "protocol_violation", 1),
    "terminal-before-started": ([terminal(0, "failed", error_type="Boom")], [], "protocol_violation", 1),
    "duplicate-started": ([started(), started()], [], "protocol_violation", 1),
    "gap": ([started(), payload(2, "b")], [], "protocol_violation", 1),
    "duplicate-payload": ([started(), payload(1, "a"), payload(1, "a")], ["a"], "protocol_violation", 1),
    "reordered": ([started(), payload(2, "b"), payload(1, "a")], [], "protocol_violation", 1),
    "terminal-skips-payload": ([started(), payload(1, "a"), terminal(3)], ["a"], "protocol_violation", 1),
    "runner-failed": (
        [started(), payload(1, "a"), terminal(2, "failed", error_type="RunnerCrashed", error_message="segfault")],
        ["a"], "RunnerCrashed", 0,
    ),
    "runner-cancelled": ([started(), payload(1, "a"), terminal(2, "cancelled")], ["a"], "cancelled", 0),
    "error-chunk-then-completed": ([started(), payload(1, "a"), error_payload(2), terminal(3)], ["a"], "OutOfMemory", 0),
    "error-chunk-explains-failure": ([started(), error_payload(1), terminal(2, "failed", error_type="E")], [], "E", 0),
}


@pytest.mark.parametrize(("frames", "texts", "error_type", "violations"), LIFECYCLES.values(), ids=LIFECYCLES.keys())
async def test_lifecycle(frames, texts, error_type, violations):
    got_texts, failure, streams = await run(frames)
    assert got_texts == texts
    assert (failure.error_type if failure else None) == error_type
    stats = streams.stats()
    assert stats["protocolViolations"] == violations
    assert stats["openStreams"] == 0
    if failure is not None:
        assert failure.origin == ("api" if violations else "runner")


async def test_runner_failure_carries_its_message_and_kind():
    _, failure, _ = await run([started(), terminal(1, "failed", error_type="RunnerCrashed", error_message="segfault")])
    assert failure.message == "segfault"
    assert failure.outcome == "failed" and failure.kind == "internal"


async def test_cancelled_terminal_is_a_cancellation():
    _, failure, _ = await run([started(), terminal(1, "cancelled")])
    assert failure.outcome == "cancelled" and failure.kind == "cancelled"


async def test_frames_after_the_end_are_counted_as_late_and_dropped():
    texts, failure, streams = await run([started(), payload(1, "a"), terminal(2), payload(3, "late"), terminal(4)])
    assert texts == ["a"] and failure is None
    assert streams.stats()["droppedLateFrames"] == 2
    assert streams.stats()["protocolViolations"] == 0


def test_frames_for_unknown_commands_are_counted_and_dropped():
    streams = CommandStreams()
    streams.deliver(started("nobody"))
    streams.deliver(payload(1, cid="nobody"))
    assert streams.stats()["droppedUnknownFrames"] == 2
    assert streams.stats()["openStreams"] == 0


def test_a_command_gets_one_stream():
    streams = CommandStreams()
    streams.open(CID)
    with pytest.raises(ValueError):
        streams.open(CID)


async def test_open_streams_are_bounded():
    streams = CommandStreams(max_open_streams=2)
    first, _second = streams.open("a"), streams.open("b")
    with pytest.raises(Overloaded) as error:
        streams.open("c")
    assert error.value.kind == "overloaded"
    assert streams.stats()["rejectedOverloaded"] == 1
    assert first.close() is True
    streams.open("c")  # the slot came back
    assert streams.stats()["openStreams"] == 2


def test_a_full_table_reclaims_expired_streams_before_refusing():
    clock = FakeClock()
    streams = CommandStreams(max_open_streams=1, first_frame_deadline_s=10, clock=clock)
    streams.open("a")
    clock.now += 10
    streams.open("b")
    assert streams.stats()["expiredFirstFrame"] == 1
    assert not streams.is_open("a") and streams.is_open("b")


async def test_a_client_that_falls_behind_is_failed_not_buffered_forever():
    texts, failure, streams = await run(
        [started(), payload(1, "a"), payload(2, "b"), payload(3, "c"), terminal(4)], max_queued_frames=2
    )
    assert texts == ["a", "b"]
    assert failure.error_type == "client_too_slow" and failure.origin == "api"
    assert streams.stats()["overflows"] == 1
    assert streams.stats()["droppedLateFrames"] == 1  # the terminal arrived after the end


async def test_queued_frames_are_reported():
    streams = CommandStreams()
    streams.open(CID)
    for frame in (started(), payload(1), payload(2)):
        streams.deliver(frame)
    assert streams.stats()["queuedFrames"] == 2


async def test_idle_lease_ends_a_silent_stream_and_frees_its_slot():
    clock = FakeClock()
    streams = CommandStreams(idle_lease_s=60, clock=clock)
    stream = streams.open(CID)
    streams.deliver(started())
    clock.now += 59
    assert streams.expire() == []
    streams.deliver(payload(1, "a"))  # a frame renews the lease
    clock.now += 59
    assert streams.expire() == []
    clock.now += 1
    assert streams.expire() == [CID]
    texts, failure = await drain(stream)
    assert texts == ["a"]
    assert failure.error_type == "idle_timeout" and "no output from the runner" in failure.message.lower()
    assert failure.kind == "timeout"
    assert streams.stats()["expiredIdle"] == 1 and streams.stats()["openStreams"] == 0


async def test_first_frame_deadline_ends_a_stream_that_never_starts():
    clock = FakeClock()
    streams = CommandStreams(first_frame_deadline_s=120, clock=clock)
    stream = streams.open(CID)
    clock.now += 119.9
    assert streams.expire() == []
    clock.now += 0.1
    assert streams.expire() == [CID]
    _, failure = await drain(stream)
    assert failure.error_type == "first_frame_timeout"
    assert streams.stats()["expiredFirstFrame"] == 1


def test_first_frame_deadline_does_not_apply_once_started():
    clock = FakeClock()
    streams = CommandStreams(first_frame_deadline_s=1, idle_lease_s=100, clock=clock)
    streams.open(CID)
    streams.deliver(started())
    clock.now += 50
    assert streams.expire() == []


@pytest.mark.parametrize(
    ("frames", "error_type"),
    [([], "first_frame_timeout"), ([started(), payload(1)], "idle_timeout")],
    ids=["never-started", "went-silent"],
)
async def test_a_waiting_consumer_enforces_its_own_deadlines(frames, error_type):
    # Real clock, tiny deadlines: nobody calls expire(); the waiting consumer must end itself.
    _, failure, streams = await run(frames, first_frame_deadline_s=0.05, idle_lease_s=0.1)
    assert failure.error_type == error_type
    assert streams.stats()["openStreams"] == 0


async def test_fail_all_ends_every_open_stream_at_once():
    streams = CommandStreams()
    a, b = streams.open("a"), streams.open("b")
    streams.deliver(started("a"))
    waiting = [asyncio.create_task(drain(s)) for s in (a, b)]
    await asyncio.sleep(0)  # both consumers are now waiting
    assert streams.fail_all("MasterFailover", "the master changed") == 2
    results = await asyncio.wait_for(asyncio.gather(*waiting), timeout=HANG_GUARD_S)
    assert [failure.error_type for _, failure in results] == ["MasterFailover", "MasterFailover"]
    assert all(failure.origin == "api" and failure.kind == "unavailable" for _, failure in results)
    assert streams.stats()["openStreams"] == 0 and streams.stats()["failedByFailover"] == 2
    assert streams.fail_all("MasterFailover", "again") == 0


async def test_close_while_open_frees_the_slot_and_asks_for_a_cancel():
    streams = CommandStreams()
    stream = streams.open(CID)
    streams.deliver(started())
    streams.deliver(payload(1, "a"))
    waiting = asyncio.create_task(drain(stream))
    assert stream.close() is True
    assert stream.close() is False
    texts, failure = await asyncio.wait_for(waiting, timeout=HANG_GUARD_S)
    assert texts == []  # queued output is dropped: nobody is left to read it
    assert failure.error_type == "client_closed" and failure.origin == "client"
    streams.deliver(payload(2, "b"))
    stats = streams.stats()
    assert stats["openStreams"] == 0 and stats["closedByClient"] == 1 and stats["droppedLateFrames"] == 1


async def test_close_after_the_terminal_needs_no_cancel():
    streams = CommandStreams()
    stream = streams.open(CID)
    streams.deliver(started())
    streams.deliver(terminal(1))
    assert stream.close() is False


async def test_fail_and_cancel_end_open_streams_only():
    streams = CommandStreams()
    failed, cancelled = streams.open("a"), streams.open("b")
    assert streams.fail("a", "InstanceGone", "the instance was deleted") is True
    assert streams.fail("a", "InstanceGone", "again") is False
    assert streams.cancel("b") is True
    assert streams.cancel("zzz") is False
    _, failure = await drain(failed)
    assert (failure.error_type, failure.origin, failure.kind) == ("InstanceGone", "api", "unavailable")
    _, failure = await drain(cancelled)
    assert (failure.outcome, failure.origin) == ("cancelled", "client")
    assert streams.stats()["failed"] == 1 and streams.stats()["cancelled"] == 1


async def test_other_chunk_types_pass_through():
    embedding = ResultChunk(command_id=CID, result=EmbeddingResult(embeddings=[[0.5]]))
    streams = CommandStreams()
    stream = streams.open(CID)
    for frame in (started(), StreamPayload(command_id=CID, seq=1, chunk=embedding), terminal(2)):
        streams.deliver(frame)
    assert [chunk async for chunk in stream] == [embedding]


def test_stats_name_bounds_and_counters():
    stats = CommandStreams(max_open_streams=3, max_queued_frames=7).stats()
    assert stats["capacity"] == 3 and stats["maxQueuedFrames"] == 7
    for key in ("openStreams", "queuedFrames", "droppedLateFrames", "droppedUnknownFrames", "protocolViolations",
                "expiredIdle", "expiredFirstFrame", "overflows", "rejectedOverloaded"):
        assert stats[key] == 0


def test_a_first_frame_timeout_says_what_the_request_was_waiting_for():
    now = [0.0]
    streams = CommandStreams(first_frame_deadline_s=5, clock=lambda: now[0],
                             explain_wait=lambda command_id: f"runner r1 of {command_id} is Loading")
    stream = streams.open("c1")
    now[0] = 5.0
    assert streams.expire() == ["c1"]
    with pytest.raises(StreamFailed) as failure:
        stream.__anext__().send(None)
    assert failure.value.message == "No runner started this request within 5 s: runner r1 of c1 is Loading."


def test_waiting_streams_are_those_without_a_first_frame():
    streams = CommandStreams()
    streams.open("a")
    streams.open("b")
    streams.open("c")
    streams.deliver(started("b"))
    streams.fail("c", "NodeLost", "gone")
    assert streams.waiting_command_ids() == ["a"]
    assert sorted(streams.open_command_ids()) == ["a", "b"]


# -- the terminal grace: a Complete task whose last frame never arrives ----------------------


async def test_a_complete_task_whose_terminal_was_lost_ends_typed_after_the_grace_not_the_idle_lease():
    clock = FakeClock()
    streams = CommandStreams(idle_lease_s=1800, terminal_grace_s=10, clock=clock)
    stream = streams.open(CID)
    for frame in (started(), payload(1, "a")):
        streams.deliver(frame)
    assert streams.expect_terminal(CID)
    clock.now += 9.9
    assert streams.expire() == []
    assert streams.expect_terminal(CID)  # a second sighting (a snapshot) does not push the deadline
    clock.now += 0.1
    assert streams.expire() == [CID]
    texts, failure = await drain(stream)
    assert texts == ["a"]  # what did arrive is delivered first
    assert failure.error_type == "terminal_lost" and failure.kind == "upstream"
    assert "completed in the cluster" in failure.message and "10 s" in failure.message
    assert streams.stats()["expiredTerminal"] == 1 and streams.stats()["openStreams"] == 0


async def test_a_terminal_that_arrives_within_the_grace_completes_the_stream():
    clock = FakeClock()
    streams = CommandStreams(terminal_grace_s=10, clock=clock)
    stream = streams.open(CID)
    streams.deliver(started())
    streams.expect_terminal(CID)  # State can show Complete before the frames land
    streams.deliver(payload(1, "a"))
    clock.now += 5
    streams.deliver(terminal(2))
    clock.now += 60
    assert streams.expire() == []
    assert await drain(stream) == (["a"], None)
    assert not streams.expect_terminal(CID)  # already ended: nothing to arm


async def test_a_consumer_already_waiting_under_the_idle_lease_honours_the_terminal_grace():
    # Real clock: the consumer armed its timer for the 30-minute lease; the grace must re-arm it.
    streams = CommandStreams(terminal_grace_s=0.0)
    stream = streams.open(CID)
    streams.deliver(started())
    reader = asyncio.create_task(drain(stream))
    await asyncio.sleep(0)  # the consumer is now waiting
    streams.expect_terminal(CID)
    _, failure = await asyncio.wait_for(reader, HANG_GUARD_S)
    assert failure is not None and failure.error_type == "terminal_lost"
