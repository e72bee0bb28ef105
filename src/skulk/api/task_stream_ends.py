"""Which of this node's open streams a cluster event ends, and how: a pure decision.

The API node that owns a task holds its client's stream. When the cluster fails or cancels
the task (a TaskFailed from the master, a terminal TaskStatusUpdated), that stream must end
now, with the task's own error type, so the client can tell node loss (`NodeLost`) from a
refused placement (`PlacementRefused`) instead of one generic `TaskFailed`. The node's shell
only applies the answer (`CommandStreams.fail`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from skulk.shared.types.events import Event
from skulk.shared.types.ids import TaskId
from skulk.shared.types.state import State
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import TextGeneration


@dataclass(frozen=True)
class StreamEnd:
    """End the stream of `command_id` with this error."""

    command_id: str
    error_type: StreamErrorType | str
    message: str
    outcome: Literal["failed", "cancelled"] = "failed"


def event_task_id(event: Event) -> str | None:
    """The task an event is about: `task_id` on task events, `task.task_id` on TaskCreated."""
    task_id = getattr(event, "task_id", None)
    if task_id is None:
        task_id = getattr(getattr(event, "task", None), "task_id", None)
    return task_id


def stream_end_for(state: State, event: Event, node_id: str) -> StreamEnd | None:
    """The stream end an applied event implies for the streams `node_id` owns, if any.

    `state` is the state after the event. Only text generations carry an owner's stream;
    only Failed and Cancelled end it (Complete is ended by the runner's own terminal)."""
    task_id = event_task_id(event)
    task = state.tasks.get(TaskId(task_id)) if task_id else None
    if not isinstance(task, TextGeneration) or task.owner_node_id != node_id:
        return None
    if task.status == "Failed":
        return StreamEnd(task.command_id, task.error_type or StreamErrorType.TASK_FAILED,
                         task.error_message or "the task failed")
    if task.status == "Cancelled":
        return StreamEnd(task.command_id, StreamErrorType.TASK_CANCELLED,
                         task.error_message or "the task was cancelled", outcome="cancelled")
    return None


__all__ = ["StreamEnd", "event_task_id", "stream_end_for"]
