"""The flight recorder: an always-on, bounded, in-memory record of what one node lived
through recently, for the operator who arrives after something went wrong.

It keeps the last FLIGHT_RECORDER_CAPACITY records of: events applied (placements,
repairs, runner status changes, task outcomes, node arrivals and losses: the decisions the
cluster took, as this node saw them land), election changes, and request lifecycles
(opened, ended and how). `LogRing` keeps the node's last log lines beside it.

Cheap by construction: a record is a small dict appended to a `deque(maxlen=...)` (O(1),
atomic under the GIL, the oldest record falls off). It is never gossiped, never written to
disk, and it must never hold prompt text or generated output: ids, types and outcomes only.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from skulk.shared.types.events import IndexedEvent

FLIGHT_RECORDER_CAPACITY = 1024
"""Records kept per node. An event applied, an election change or a request's open/end is
one record of ~150 bytes: about 150 KiB, minutes of a busy node's life."""

LOG_RING_CAPACITY = 500
"""Log lines kept per node for capture bundles (INFO and above, one line each)."""

LOG_LINE_MAX_CHARS = 2000
"""A longer log line (a traceback) is cut here so one line cannot swamp the ring."""

_EVENT_ID_FIELDS = ("instance_id", "runner_id", "node_id", "task_id", "model_id", "command_id")
"""Fields of an event worth keeping in its record: the ids an operator follows."""


def event_record(indexed: IndexedEvent) -> dict[str, Any]:
    """The flight-recorder fields of one applied event: index, type, the ids it carries and,
    for status changes, the new state and reason. Pure."""
    event = indexed.event
    fields: dict[str, Any] = {"idx": indexed.idx, "event": event.type}
    for name in _EVENT_ID_FIELDS:
        value = getattr(event, name, None)
        if isinstance(value, str):
            fields[name] = value
    task = getattr(event, "task", None)
    if task is not None:
        fields["task_id"] = getattr(task, "task_id", None)
        fields["task"] = getattr(task, "type", None)
        if isinstance(getattr(task, "command_id", None), str):
            fields["command_id"] = task.command_id
        fields["instance_id"] = getattr(task, "instance_id", fields.get("instance_id"))
    instance = getattr(event, "instance", None)
    if instance is not None:
        fields["instance_id"] = getattr(instance, "instance_id", None)
        fields["model_id"] = getattr(instance, "model_id", None)
    status: Any = getattr(event, "status", None)
    if isinstance(status, str):
        fields["status"] = status
    elif isinstance(getattr(status, "state", None), str):
        fields["state"] = status.state
    reason = getattr(event, "error_message", None) or getattr(status, "error_message", None)
    if isinstance(reason, str):
        fields["reason"] = reason[:300]
    return fields


class FlightRecorder:
    """A bounded ring of records: `record(kind, **fields)` from anywhere on the node."""

    def __init__(self, capacity: int = FLIGHT_RECORDER_CAPACITY, clock: Callable[[], float] = time.time) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._records: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._clock = clock
        self.recorded = 0

    @property
    def capacity(self) -> int:
        return self._records.maxlen or 0

    def record(self, kind: str, **fields: Any) -> None:
        self._records.append({"at": self._clock(), "kind": kind, **fields})
        self.recorded += 1

    def on_event_applied(self, indexed: IndexedEvent) -> None:
        self.record("event", **event_record(indexed))

    def on_stream(self, phase: str, command_id: str, model_id: str, outcome: str | None) -> None:
        """A request's command stream opened or ended (`skulk.api.streams` lifecycle hook)."""
        fields: dict[str, Any] = {"phase": phase, "command_id": command_id, "model_id": model_id}
        if outcome is not None:
            fields["outcome"] = outcome
        self.record("request", **fields)

    def snapshot(self) -> dict[str, Any]:
        """Oldest record first, with the bounds: for diagnostics and capture bundles."""
        records = list(self._records)
        return {
            "capacity": self.capacity,
            "size": len(records),
            "recorded": self.recorded,
            "dropped": self.recorded - len(records),
            "records": records,
        }


class LogRing(logging.Handler):
    """A logging handler keeping the last LOG_RING_CAPACITY formatted lines in memory."""

    def __init__(self, capacity: int = LOG_RING_CAPACITY, level: int = logging.INFO) -> None:
        super().__init__(level)
        self._lines: deque[str] = deque(maxlen=capacity)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record)[:LOG_LINE_MAX_CHARS])
        except Exception:
            self.handleError(record)

    def lines(self) -> list[str]:
        return list(self._lines)


__all__ = [
    "FLIGHT_RECORDER_CAPACITY",
    "LOG_LINE_MAX_CHARS",
    "LOG_RING_CAPACITY",
    "FlightRecorder",
    "LogRing",
    "event_record",
]
