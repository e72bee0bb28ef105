"""The serving side of keeping request text out of State: the full params of the commands
this node runs, as they arrive over the data plane (or in-process when the API is local).

A task is dispatched to its runner only once its input is here (`worker.plan`); the input is
forgotten when the task ends, and any input left waiting (its task never came, or the worker
missed its end) expires after `INPUT_TTL_S`. Bounded: past `MAX_INPUTS` the oldest goes.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from skulk.shared.types.ids import CommandId
from skulk.shared.types.task_inputs import TaskInput
from skulk.shared.types.tasks import ApiTask, WorkloadParams

logger = logging.getLogger(__name__)

MAX_INPUTS = 1024
"""Inputs one node holds for tasks it runs or is about to run (several API nodes send)."""

INPUT_TTL_S = 30 * 60.0
"""An input is kept at most this long (the API stream's idle lease): a task that long in
flight has long been dispatched or failed."""


def input_params(task: ApiTask, item: TaskInput | None) -> WorkloadParams | None:
    """The params a dispatched task runs with: its input's, when the input is of the task's
    own workload (State holds the redacted params; the runner gets the request's own). None:
    no input yet, or one of another workload (a bad sender's; the task waits for a proper one)."""
    if item is None or item.params.workload != task.params.workload:
        return None
    return item.params


class TaskInputStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._inputs: OrderedDict[CommandId, tuple[TaskInput, float]] = OrderedDict()
        self.received = 0
        self.evicted = 0

    def accept(self, item: TaskInput) -> None:
        self.received += 1
        if item.command_id not in self._inputs and len(self._inputs) >= MAX_INPUTS:
            command_id, _ = self._inputs.popitem(last=False)
            self.evicted += 1
            logger.warning("task input of command %s evicted: %d inputs held", command_id, MAX_INPUTS)
        self._inputs[item.command_id] = (item, self._clock())

    def ready(self) -> frozenset[CommandId]:
        return frozenset(self._inputs)

    def get(self, command_id: CommandId) -> TaskInput | None:
        entry = self._inputs.get(command_id)
        return entry[0] if entry else None

    def forget(self, command_id: CommandId) -> None:
        self._inputs.pop(command_id, None)

    def expire(self) -> None:
        deadline = self._clock() - INPUT_TTL_S
        for command_id, (_, received_at) in list(self._inputs.items()):
            if received_at < deadline:
                del self._inputs[command_id]
                self.evicted += 1

    def stats(self) -> dict[str, int]:
        return {"held": len(self._inputs), "capacity": MAX_INPUTS, "received": self.received, "evicted": self.evicted}


__all__ = ["INPUT_TTL_S", "MAX_INPUTS", "TaskInputStore", "input_params"]
