"""The API side of keeping request text out of State: hold each request's full params until
the master has bound its task to an instance, then hand them to the node that runs the
task's rank 0 (see `skulk.shared.types.task_inputs` for why).

`input_destination` is the pure decision; `TaskInputRelay` holds the inputs (bounded, each
for at most `INPUT_HOLD_S`) and calls `send(node_id, input)` once per input. It is flushed
after every applied `TaskCreated` and on the node's one-second housekeeping tick, so an
input whose task arrived inside a snapshot (not as an event) still leaves.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from skulk.shared.types.common import TERMINAL_TASK_STATUSES
from skulk.shared.types.events import IndexedEvent, TaskCreated
from skulk.shared.types.state import State
from skulk.shared.types.task_inputs import TaskInput

logger = logging.getLogger(__name__)

MAX_HELD_INPUTS = 512
"""Inputs waiting for their task's binding on one API node (2x its open-stream bound); past
it the oldest is dropped, and its request then fails at its first-frame deadline."""

INPUT_HOLD_S = 120.0
"""How long an input waits for its task (the API stream's own first-frame deadline)."""


@dataclass(frozen=True)
class Wait:
    """The master has not bound the command to a task yet."""


@dataclass(frozen=True)
class Drop:
    reason: str


@dataclass(frozen=True)
class SendTo:
    node_id: str


Destination = Wait | Drop | SendTo
WAIT = Wait()


def input_destination(state: State, command_id: str) -> Destination:
    """Where the input of `command_id` goes: the node of its task's rank 0, once bound."""
    task = next((t for t in state.tasks.values() if getattr(t, "command_id", None) == command_id), None)
    if task is None:
        return WAIT
    if task.status in TERMINAL_TASK_STATUSES:
        return Drop(f"task {task.task_id} already ended ({task.status})")
    instance = state.instances.get(task.instance_id)
    if instance is None or not instance.shards:
        return Drop(f"task {task.task_id} has no instance")
    return SendTo(instance.shards[0].node_id)


class TaskInputRelay:
    def __init__(self, send: Callable[[str, TaskInput], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self._clock = clock
        self._held: OrderedDict[str, tuple[TaskInput, float]] = OrderedDict()
        self.sent = 0
        self.dropped = 0

    def hold(self, item: TaskInput) -> None:
        if len(self._held) >= MAX_HELD_INPUTS:
            command_id, _ = self._held.popitem(last=False)
            self.dropped += 1
            logger.warning("task input of command %s dropped: %d inputs already wait for their tasks",
                           command_id, MAX_HELD_INPUTS)
        self._held[item.command_id] = (item, self._clock())

    def discard(self, command_id: str) -> None:
        """The request ended before its input left (refused, cancelled)."""
        self._held.pop(command_id, None)

    def flush(self, state: State) -> None:
        now = self._clock()
        for command_id, (item, held_at) in list(self._held.items()):
            destination = input_destination(state, command_id)
            if isinstance(destination, Wait):
                if now - held_at > INPUT_HOLD_S:
                    del self._held[command_id]
                    self.dropped += 1
                    logger.warning("task input of command %s expired: no task after %.0f s", command_id, INPUT_HOLD_S)
                continue
            del self._held[command_id]
            if isinstance(destination, Drop):
                self.dropped += 1
                continue
            self.sent += 1
            self._send(destination.node_id, item)

    def on_event(self, indexed: IndexedEvent, state: State) -> None:
        if self._held and isinstance(indexed.event, TaskCreated):
            self.flush(state)

    def stats(self) -> dict[str, int]:
        return {"held": len(self._held), "capacity": MAX_HELD_INPUTS, "sent": self.sent, "dropped": self.dropped}


__all__ = ["INPUT_HOLD_S", "MAX_HELD_INPUTS", "Drop", "SendTo", "TaskInputRelay", "Wait", "input_destination"]
