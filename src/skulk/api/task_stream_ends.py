"""Which of this node's open streams a cluster event ends, and how: a pure decision.

The API node that owns a task holds its client's stream. When the cluster fails or cancels
the task (a TaskFailed from the master, a terminal TaskStatusUpdated), that stream must end
now, with the task's own error type, so the client can tell node loss (`NodeLost`) from a
refused placement (`PlacementRefused`) instead of one generic `TaskFailed`. The node's shell
only applies the answer (`CommandStreams.fail`).
"""

from __future__ import annotations

from collections.abc import Iterable
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
    only Failed and Cancelled end it (Complete is ended by the runner's own terminal, which is
    then due: `awaiting_terminal`)."""
    task_id = event_task_id(event)
    task = state.tasks.get(TaskId(task_id)) if task_id else None
    return _end_of(task, node_id)


def _end_of(task: object, node_id: str) -> StreamEnd | None:
    if not isinstance(task, TextGeneration) or task.owner_node_id != node_id:
        return None
    if task.status == "Failed":
        return StreamEnd(task.command_id, task.error_type or StreamErrorType.TASK_FAILED,
                         task.error_message or "the task failed")
    if task.status == "Cancelled":
        return StreamEnd(task.command_id, StreamErrorType.TASK_CANCELLED,
                         task.error_message or "the task was cancelled", outcome="cancelled")
    return None


def awaiting_terminal(state: State, event: Event, node_id: str) -> str | None:
    """The command of a stream `node_id` owns whose task an applied event just showed
    Complete: its runner finished, so its terminal frame is due (`CommandStreams.expect_terminal`).
    The data plane is not ordered with State, so the frame may still be on its way; it may
    also have been dropped (a full send queue on the runner's node), and without this the
    stream would wait for the idle lease."""
    task_id = event_task_id(event)
    task = state.tasks.get(TaskId(task_id)) if task_id else None
    return _completed(task, node_id)


def _completed(task: object, node_id: str) -> str | None:
    if isinstance(task, TextGeneration) and task.owner_node_id == node_id and task.status == "Complete":
        return task.command_id
    return None


def completed_in(state: State, open_commands: Iterable[str], node_id: str) -> list[str]:
    """The open streams of `node_id` whose task `state` shows Complete (an adopted snapshot),
    sorted: each awaits its terminal frame as after `awaiting_terminal`."""
    wanted = frozenset(open_commands)
    return sorted(c for task in state.tasks.values()
                  if (c := _completed(task, node_id)) is not None and c in wanted)


def stream_ends_in(state: State, open_commands: Iterable[str], node_id: str) -> list[StreamEnd]:
    """The ends `state` implies for the open streams `open_commands` of `node_id`: each whose
    task is Failed or Cancelled there. For a snapshot the replica adopted wholesale (a new
    master session, a replica that fell out of order): the events inside it reach no
    listener, so a TaskFailed the new master indexed before this node synced would otherwise
    leave its stream waiting for the first-frame deadline or the idle lease."""
    wanted = frozenset(open_commands)
    ends = [end for task in state.tasks.values()
            if getattr(task, "command_id", None) in wanted and (end := _end_of(task, node_id)) is not None]
    return sorted(ends, key=lambda end: end.command_id)


__all__ = ["StreamEnd", "awaiting_terminal", "completed_in", "event_task_id", "stream_end_for", "stream_ends_in"]
