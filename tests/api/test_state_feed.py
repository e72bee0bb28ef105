"""The change feed behind /v1/events: event log entries, wake-ups, and its bounds."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from skulk.api.state_feed import StateFeed, TooManySubscribers, summarize
from skulk.shared.types.events import IndexedEvent, InstanceDeleted, NodeTimedOut, TracingStateChanged

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def indexed(idx: int, event) -> IndexedEvent:
    return IndexedEvent(idx=idx, origin="master", indexed_at=NOW, event=event)


@pytest.mark.parametrize(("event", "kind", "fields"), [
    (InstanceDeleted(event_id="e", instance_id="i1", reason="operator"), "InstanceDeleted", {"instanceId": "i1"}),
    (TracingStateChanged(event_id="e", enabled=True), "TracingStateChanged", {"enabled": True}),
    (NodeTimedOut(event_id="e", node_id="n1", last_event_age_s=31.0, effective_age_s=31.0, timeout_s=30.0),
     "NodeTimedOut", {"nodeId": "n1"}),
])
def test_entries_name_the_event_and_its_ids(event, kind, fields):
    entry = summarize(indexed(7, event)).to_wire()
    assert entry["idx"] == 7 and entry["type"] == kind
    assert fields.items() <= entry["fields"].items()


def test_the_log_is_bounded_and_keeps_the_newest():
    feed = StateFeed(recent=3)
    for idx in range(5):
        feed.record(indexed(idx, InstanceDeleted(event_id="e", instance_id=f"i{idx}", reason="operator")))
    assert [e["idx"] for e in feed.recent_wire()] == [2, 3, 4]
    assert feed.version == 5


def test_subscribers_are_bounded():
    feed = StateFeed(max_subscribers=1)
    feed.subscribe()
    with pytest.raises(TooManySubscribers):
        feed.subscribe()
    feed.unsubscribe()
    feed.subscribe()
    assert feed.stats()["subscribers"] == 1


async def test_a_waiter_wakes_on_a_change_and_returns_on_its_deadline_otherwise():
    feed = StateFeed()
    assert await feed.wait_for_change(feed.version, timeout_s=0.01) == 0  # nothing happened
    waiter = asyncio.create_task(feed.wait_for_change(0, timeout_s=60))
    await asyncio.sleep(0)
    feed.record(indexed(0, InstanceDeleted(event_id="e", instance_id="i", reason="operator")))
    assert await asyncio.wait_for(waiter, timeout=10) == 1
    assert await feed.wait_for_change(0, timeout_s=60) == 1  # already changed: no wait
