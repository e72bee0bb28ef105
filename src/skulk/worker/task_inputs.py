"""The serving side of keeping request text out of State: the full params of the commands
this node runs, as they arrive over the data plane (or in-process when the API is local).

A task is dispatched to its runner only once its input is here (`worker.plan`); the input is
forgotten when the task ends, and any input left waiting (its task never came, or the worker
missed its end) expires after `INPUT_TTL_S`. Bounded: past `MAX_INPUTS` the oldest goes.

Inputs arrive in chunks (`skulk.shared.input_transfer`): `InputAssembler` keeps the chunks of
each transfer in memory (bounded per command, per sending node and in total), hands the
input on only once it is complete and its SHA-256 checked, and answers every transfer with a
`TaskInputAck`, so a runner never starts on a partial or corrupted input. Nothing of an input
is ever written to disk.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

from skulk.shared.input_transfer import (
    MAX_COMMAND_INPUT_BYTES,
    MAX_IN_FLIGHT_BYTES,
    MAX_SENDER_IN_FLIGHT_BYTES,
    Completed,
    Duplicate,
    Reassemblies,
    Refused,
    ack_for,
)
from skulk.shared.types.ids import CommandId
from skulk.shared.types.task_inputs import TaskInput, TaskInputAck, TaskInputChunk, TransferError
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


class InputAssembler:
    """The serving side of a transfer: chunks in, verified inputs to `deliver`, acks to
    `answer(sender, ack)`. `deliver` is None on a node without a worker: it refuses every
    transfer (NO_WORKER) instead of holding inputs nothing will run."""

    def __init__(self, deliver: Callable[[TaskInput], None] | None, answer: Callable[[str, TaskInputAck], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._deliver = deliver
        self._answer = answer
        self._clock = clock
        self._book = Reassemblies()
        self.chunks = 0
        self.duplicates = 0
        self.completed = 0
        self.refused = 0
        self.expired = 0

    def receive(self, sender: str, chunk: TaskInputChunk) -> None:
        self.chunks += 1
        if self._deliver is None:
            if chunk.seq == chunk.count - 1:  # one refusal per transfer
                self.refused += 1
                self._answer(sender, ack_for(chunk, TransferError.NO_WORKER, "this node runs no worker"))
            return
        self._book, outcome = self._book.receive(sender, chunk, self._clock())
        if isinstance(outcome, Completed):
            self.completed += 1
            self._deliver(outcome.item)
            self._answer(sender, outcome.ack)
        elif isinstance(outcome, Refused):
            self.refused += 1
            logger.warning("task input of command %s from node %s refused: %s: %s", chunk.command_id, sender,
                           outcome.ack.error, outcome.ack.detail)
            self._answer(sender, outcome.ack)
        elif isinstance(outcome, Duplicate):
            self.duplicates += 1
            if outcome.ack is not None:
                self._answer(sender, outcome.ack)

    def expire(self) -> None:
        partials = self._book.partials
        self._book, acks = self._book.expire(self._clock())
        for ack in acks:
            self.expired += 1
            sender = partials[ack.transfer_id].sender
            logger.warning("task input of command %s from node %s expired incomplete", ack.command_id, sender)
            self._answer(sender, ack)

    def stats(self) -> dict[str, int]:
        return {"inFlight": len(self._book.partials), "inFlightBytes": self._book.in_flight_bytes(),
                "maxInFlightBytes": MAX_IN_FLIGHT_BYTES, "maxSenderInFlightBytes": MAX_SENDER_IN_FLIGHT_BYTES,
                "maxCommandBytes": MAX_COMMAND_INPUT_BYTES, "chunks": self.chunks, "duplicates": self.duplicates,
                "completed": self.completed, "refused": self.refused, "expired": self.expired}


__all__ = ["INPUT_TTL_S", "MAX_INPUTS", "InputAssembler", "TaskInputStore", "input_params"]
