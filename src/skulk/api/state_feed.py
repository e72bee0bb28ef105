"""The change feed behind `GET /v1/events`: wakes the dashboard's event streams when State
changes, and keeps the recent event log they show.

The node calls `record(event)` for every indexed event it applies; each open stream waits
on `wait_for_change(seen, timeout_s)` and then renders one coalesced snapshot, so a burst of
events costs one frame per stream, never a queue per stream. The feed holds no State (the
API reads it through `ApiContext`) and never blocks the replica: `record` only appends to a
bounded deque and sets an asyncio event.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from pydantic.alias_generators import to_camel

from skulk.shared.types.events import IndexedEvent

RECENT_EVENTS = 200
"""Events kept for the dashboard's event log (newest last); older ones are dropped."""

MAX_SUBSCRIBERS = 64
"""Open `/v1/events` streams one node serves at once; one more is refused with a 503."""

SUMMARY_FIELDS = ("node_id", "model_id", "instance_id", "runner_id", "task_id", "command_id", "node_name", "enabled")
"""Fields lifted from an event into its one-line log entry, when the event has them."""


@dataclass(frozen=True)
class EventEntry:
    """One line of the dashboard's event log."""

    idx: int
    type: str
    fields: dict[str, Any]
    at: float | None = None
    """When this node applied it (Unix seconds): the dashboard's event timeline."""

    def to_wire(self) -> dict[str, Any]:
        return {"idx": self.idx, "type": self.type, "fields": self.fields, "at": self.at}


def summarize(event: IndexedEvent, at: float | None = None) -> EventEntry:
    """The log entry of an indexed event: its index, type, identifying fields and the time
    it was applied here. Pure."""
    inner = event.event
    sources = [inner, getattr(inner, "instance", None)]  # InstanceCreated nests its ids
    fields: dict[str, Any] = {}
    for source in sources:
        for name in SUMMARY_FIELDS:
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, str | int | bool):
                fields.setdefault(to_camel(name), value)
    return EventEntry(idx=event.idx, type=inner.type, fields=fields, at=at)


class TooManySubscribers(Exception):
    """`MAX_SUBSCRIBERS` streams are already open on this node."""


class StateFeed:
    """Version counter + wake-up for open streams + the bounded recent-event log."""

    def __init__(self, recent: int = RECENT_EVENTS, max_subscribers: int = MAX_SUBSCRIBERS) -> None:
        self.version = 0
        self.recent: deque[EventEntry] = deque(maxlen=recent)
        self.max_subscribers = max_subscribers
        self.subscribers = 0
        self.closed = False
        self._changed: asyncio.Event | None = None

    def record(self, event: IndexedEvent) -> None:
        self.recent.append(summarize(event, time.time()))
        self.notify()

    def notify(self) -> None:
        self.version += 1
        if self._changed is not None:
            self._changed.set()

    def close(self) -> None:
        """The node is stopping: every open stream ends at its next wake-up (now)."""
        self.closed = True
        self.notify()

    def subscribe(self) -> None:
        if self.subscribers >= self.max_subscribers:
            raise TooManySubscribers(f"{self.subscribers} event streams are open on this node (the bound)")
        self.subscribers += 1

    def unsubscribe(self) -> None:
        self.subscribers = max(0, self.subscribers - 1)

    async def wait_for_change(self, seen: int, timeout_s: float) -> int:
        """The version once it differs from `seen`, or the current one after `timeout_s`."""
        if self._changed is None:
            self._changed = asyncio.Event()
        if self.version == seen and not self.closed:
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=timeout_s)
            except TimeoutError:
                pass
        return self.version

    def recent_wire(self) -> list[dict[str, Any]]:
        return [entry.to_wire() for entry in self.recent]

    def stats(self) -> dict[str, int]:
        return {"subscribers": self.subscribers, "capacity": self.max_subscribers,
                "recentEvents": len(self.recent), "recentCapacity": self.recent.maxlen or 0}
