"""Which owned stream a cluster task event ends, and with which error type (pure table)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from skulk.api.errors import StreamFailed
from skulk.api.streams import CommandStreams
from skulk.api.task_stream_ends import StreamEnd, awaiting_terminal, completed_in, stream_end_for, stream_ends_in
from skulk.shared.apply import apply
from skulk.shared.types.chunks import StreamStarted, StreamTerminal
from skulk.shared.types.events import IndexedEvent, TaskAcknowledged, TaskFailed, TaskStatusUpdated
from skulk.shared.types.state import State
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import EmbeddingParams, TextGeneration, TextGenerationParams, WorkloadTask

MINE = TextGeneration(task_id="t1", instance_id="i1", command_id="c1", owner_node_id="me",
                      params=TextGenerationParams(model_id="m", prompt="x"))
THEIRS = MINE.model_copy(update={"task_id": "t2", "command_id": "c2", "owner_node_id": "other"})
EMBED = WorkloadTask(task_id="t3", instance_id="i1", command_id="c3", owner_node_id="me",
                  params=EmbeddingParams(model_id="m", inputs=["x"]))
BEFORE = State(tasks={"t1": MINE, "t2": THEIRS, "t3": EMBED})


def _after(event) -> State:  # type: ignore[no-untyped-def]
    """The state the node's listener sees: the event already applied by the real reducer."""
    return apply(BEFORE, IndexedEvent(idx=0, origin="master", indexed_at=datetime.now(UTC), event=event))


CASES = [
    ("node-lost-keeps-its-type", TaskFailed(event_id="e", task_id="t1", error_type="NodeLost", error_message="n2 left"),
     StreamEnd("c1", StreamErrorType.NODE_LOST, "n2 left")),
    ("placement-refused-keeps-its-type",
     TaskFailed(event_id="e", task_id="t1", error_type=StreamErrorType.PLACEMENT_REFUSED, error_message="no memory"),
     StreamEnd("c1", StreamErrorType.PLACEMENT_REFUSED, "no memory")),
    ("failed-by-status-has-the-generic-type", TaskStatusUpdated(event_id="e", task_id="t1", status="Failed"),
     StreamEnd("c1", StreamErrorType.TASK_FAILED, "the task failed")),
    ("failed-by-status-keeps-the-runners-type",
     TaskStatusUpdated(event_id="e", task_id="t1", status="Failed", error_type=StreamErrorType.RUNNER_CRASHED,
                       error_message="runner exited with code -9 while serving this request"),
     StreamEnd("c1", StreamErrorType.RUNNER_CRASHED, "runner exited with code -9 while serving this request")),
    ("cancelled", TaskStatusUpdated(event_id="e", task_id="t1", status="Cancelled", error_message="operator"),
     StreamEnd("c1", StreamErrorType.TASK_CANCELLED, "operator", outcome="cancelled")),
    ("another-nodes-stream", TaskFailed(event_id="e", task_id="t2", error_type="NodeLost", error_message="x"), None),
    ("not-a-generation", TaskFailed(event_id="e", task_id="t3", error_type="NodeLost", error_message="x"), None),
    ("still-running", TaskAcknowledged(event_id="e", task_id="t1"), None),
    ("unknown-task", TaskFailed(event_id="e", task_id="zz", error_type="NodeLost", error_message="x"), None),
]


@pytest.mark.parametrize(("name", "event", "expected"), CASES, ids=[c[0] for c in CASES])
def test_stream_end_for(name, event, expected) -> None:  # type: ignore[no-untyped-def]
    assert stream_end_for(_after(event), event, "me") == expected


@pytest.mark.parametrize("error_type", [StreamErrorType.NODE_LOST, StreamErrorType.PLACEMENT_REFUSED,
                                        StreamErrorType.DOWNLOAD_FAILED, StreamErrorType.GROUP_BROKEN,
                                        StreamErrorType.INSTANCE_GONE, StreamErrorType.TASK_FAILED])
def test_every_master_failure_is_a_retryable_unavailable_with_its_own_code(error_type) -> None:  # type: ignore[no-untyped-def]
    failure = StreamFailed(error_type, "m")
    assert (failure.kind, failure.code) == ("unavailable", str(error_type))


def test_the_enum_values_are_the_wire_spellings() -> None:
    assert StreamErrorType.NODE_LOST == "NodeLost"
    assert TaskFailed(event_id="e", task_id="t", error_type="NodeLost", error_message="m").model_dump(mode="json")[
        "error_type"] == "NodeLost"


def _with(task_id: str, **fields) -> State:  # type: ignore[no-untyped-def]
    return BEFORE.model_copy(update={"tasks": {**BEFORE.tasks, task_id: BEFORE.tasks[task_id].model_copy(update=fields)}})


@pytest.mark.parametrize(
    ("state", "open_commands", "expected"),
    [
        # a snapshot that already shows my open stream's task failed ends it, type kept
        (_with("t1", status="Failed", error_type="NodeLost", error_message="n2 left"), ["c1"],
         [StreamEnd("c1", StreamErrorType.NODE_LOST, "n2 left")]),
        (_with("t1", status="Cancelled"), ["c1"],
         [StreamEnd("c1", StreamErrorType.TASK_CANCELLED, "the task was cancelled", outcome="cancelled")]),
        # still running, or complete (the runner's terminal ends it): nothing
        (_with("t1", status="Running"), ["c1"], []),
        (_with("t1", status="Complete"), ["c1"], []),
        # a stream that is no longer open, another node's task, an embedding: nothing
        (_with("t1", status="Failed"), [], []),
        (_with("t2", status="Failed"), ["c2"], []),
        (_with("t3", status="Failed"), ["c3"], []),
    ],
)
def test_stream_ends_in_a_snapshot(state, open_commands, expected):
    assert stream_ends_in(state, open_commands, "me") == expected


# -- the runner's crash reaches the client typed, whichever plane is first -----------------------

CRASH = "runner exited with code -9 while serving this request"


def _crash_frames() -> list:  # type: ignore[type-arg]
    return [StreamStarted(command_id="c1", runner_id="r1"),
            StreamTerminal(command_id="c1", seq=1, outcome="failed", error_type=StreamErrorType.RUNNER_CRASHED,
                           error_message=CRASH)]


def _status_event() -> TaskStatusUpdated:
    # What the worker sends for the supervisor's TaskDone of a crashed runner.
    return TaskStatusUpdated(event_id="e", task_id="t1", status="Failed", error_type=StreamErrorType.RUNNER_CRASHED,
                             error_message=CRASH)


def _client_error(order: str) -> StreamFailed:
    """Drive one real stream the way the node does (frames into `deliver`, State's ends into
    `fail`) in the given order; the error its client reads."""
    streams = CommandStreams()
    stream = streams.open("c1", "m")
    event = _status_event()

    def control_plane() -> None:
        end = stream_end_for(_after(event), event, "me")
        assert end is not None
        streams.fail(end.command_id, end.error_type, end.message, outcome=end.outcome)

    def data_plane() -> None:
        for frame in _crash_frames():
            streams.deliver(frame)

    for step in ((control_plane, data_plane) if order == "state first" else (data_plane, control_plane)):
        step()

    async def read() -> StreamFailed:
        with pytest.raises(StreamFailed) as caught:
            async for _chunk in stream:
                pass
        return caught.value

    return asyncio.run(read())


@pytest.mark.parametrize("order", ["frames first", "state first"])
def test_a_crash_reaches_the_client_as_runner_crashed_in_either_order(order) -> None:  # type: ignore[no-untyped-def]
    failure = _client_error(order)
    assert (failure.error_type, failure.message) == (StreamErrorType.RUNNER_CRASHED, CRASH)


@pytest.mark.parametrize(
    ("name", "event", "expected"),
    [
        ("my generation complete: its terminal is due",
         TaskStatusUpdated(event_id="e", task_id="t1", status="Complete"), "c1"),
        ("still running", TaskStatusUpdated(event_id="e", task_id="t1", status="Running"), None),
        ("failed: ended by stream_end_for instead",
         TaskStatusUpdated(event_id="e", task_id="t1", status="Failed"), None),
        ("another node's stream", TaskStatusUpdated(event_id="e", task_id="t2", status="Complete"), None),
        ("not a generation", TaskStatusUpdated(event_id="e", task_id="t3", status="Complete"), None),
    ],
)
def test_awaiting_terminal(name, event, expected) -> None:  # type: ignore[no-untyped-def]
    assert awaiting_terminal(_after(event), event, "me") == expected


def test_completed_in_a_snapshot_only_my_open_streams() -> None:
    state = _with("t1", status="Complete")
    state = state.model_copy(update={"tasks": {**state.tasks, "t2": THEIRS.model_copy(update={"status": "Complete"})}})
    assert completed_in(state, ["c1", "c2"], "me") == ["c1"]
    assert completed_in(state, [], "me") == []
    assert completed_in(_with("t1", status="Running"), ["c1"], "me") == []
