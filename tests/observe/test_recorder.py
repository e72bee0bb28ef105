"""The flight recorder's records and bounds, and the log ring: pure, no node."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from skulk.observe.recorder import LOG_LINE_MAX_CHARS, FlightRecorder, LogRing, event_record
from skulk.shared.types.events import IndexedEvent, NodeJoined, RunnerStatusUpdated, TaskStatusUpdated
from skulk.shared.types.instances import RunnerStatus


@pytest.mark.parametrize(("event", "expected"), [
    (NodeJoined(event_id="e1", node_id="n1", node_name="a", version="1"),
     {"idx": 4, "event": "NodeJoined", "node_id": "n1"}),
    (RunnerStatusUpdated(event_id="e2", runner_id="r1", status=RunnerStatus(state="Failed", error_message="oom")),
     {"idx": 4, "event": "RunnerStatusUpdated", "runner_id": "r1", "state": "Failed", "reason": "oom"}),
    (TaskStatusUpdated(event_id="e3", task_id="t1", status="Failed", error_message="lost"),
     {"idx": 4, "event": "TaskStatusUpdated", "task_id": "t1", "status": "Failed", "reason": "lost"}),
])
def test_event_record_keeps_type_ids_state_and_reason(event, expected):
    indexed = IndexedEvent(idx=4, origin="m", indexed_at=datetime(2026, 1, 1, tzinfo=UTC), event=event)
    assert event_record(indexed) == expected


def test_the_recorder_keeps_the_newest_records_and_counts_the_dropped():
    clock = iter(range(100))
    recorder = FlightRecorder(capacity=3, clock=lambda: float(next(clock)))
    for n in range(5):
        recorder.record("election", n=n)
    recorder.on_stream("ended", "c1", "m/x", "completed")
    snap = recorder.snapshot()
    assert (snap["capacity"], snap["size"], snap["recorded"], snap["dropped"]) == (3, 3, 6, 3)
    assert [r.get("n") for r in snap["records"]] == [3, 4, None]
    assert snap["records"][-1] == {"at": 5.0, "kind": "request", "phase": "ended", "command_id": "c1",
                                   "model_id": "m/x", "outcome": "completed"}


def test_the_log_ring_is_bounded_and_cuts_long_lines():
    ring = LogRing(capacity=2)
    logger = logging.getLogger("skulk.test.ring")
    logger.addHandler(ring)
    logger.setLevel(logging.INFO)
    try:
        logger.debug("not kept")
        for text in ("one", "two", "x" * (LOG_LINE_MAX_CHARS * 2)):
            logger.info(text)
    finally:
        logger.removeHandler(ring)
    lines = ring.lines()
    assert len(lines) == 2 and lines[0].endswith("two") and len(lines[1]) == LOG_LINE_MAX_CHARS
