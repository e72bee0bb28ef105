"""The API side of keeping request text out of State: hold each request's full params until
the master has bound its task to an instance, then hand them to the node that runs the
task's rank 0 (see `skulk.shared.types.task_inputs` for why).

`input_destination` is the pure decision; `TaskInputRelay` holds the inputs (bounded, each
for at most `INPUT_HOLD_S`), and once bound cuts each into chunks
(`skulk.shared.input_transfer.split`) and calls `send(node_id, chunks)`. It keeps every
transfer until the serving node's `TaskInputAck` (`on_ack`), sends it again (under a fresh
transfer id) when none comes in time, and gives it up by the pure `sender_verdict`, calling `fail(command_id, error,
detail)` so the command's stream ends typed (its route then cancels the command). It is
flushed after every applied `TaskCreated` and on the node's one-second housekeeping tick, so
an input whose task arrived inside a snapshot (not as an event) still leaves, and deadlines
are checked there.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

from skulk.shared.input_transfer import MAX_HELD_TRANSFER_BYTES, GiveUp, Outgoing, Resend, sender_verdict, split
from skulk.shared.types.common import TERMINAL_TASK_STATUSES
from skulk.shared.types.events import IndexedEvent, TaskCreated
from skulk.shared.types.ids import new_id
from skulk.shared.types.state import State
from skulk.shared.types.task_inputs import TaskInput, TaskInputAck, TaskInputChunk, TransferError

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


SendChunks = Callable[[str, tuple[TaskInputChunk, ...]], None]
FailInput = Callable[[str, TransferError, str], None]


class TaskInputRelay:
    def __init__(self, send: SendChunks, fail: FailInput, clock: Callable[[], float] = time.monotonic) -> None:
        self._send = send
        self._fail = fail
        self._clock = clock
        self._held: OrderedDict[str, tuple[TaskInput, float]] = OrderedDict()
        self._outgoing: OrderedDict[str, Outgoing] = OrderedDict()
        """Transfers sent and not acknowledged, by transfer id, oldest first."""
        self.sent = 0
        self.dropped = 0
        self.chunks_sent = 0
        self.acked = 0
        self.resent = 0
        self.failed = 0

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
        for transfer_id, outgoing in list(self._outgoing.items()):
            if outgoing.chunks[0].command_id == command_id:
                del self._outgoing[transfer_id]

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
            self._start(item, destination.node_id, now)
        for transfer_id, outgoing in list(self._outgoing.items()):
            self._decide(transfer_id, outgoing, sender_verdict(outgoing, now))

    def _start(self, item: TaskInput, node_id: str, now: float) -> None:
        chunks = split(item, new_id())
        if isinstance(chunks, TransferError):
            self._give_up(item.command_id, GiveUp(chunks, "the request's input is over the per-command transfer bound"))
            return
        outgoing = Outgoing(node_id=node_id, chunks=chunks, sent_at=now)
        self._outgoing[chunks[0].transfer_id] = outgoing
        while self.held_bytes() > MAX_HELD_TRANSFER_BYTES and len(self._outgoing) > 1:
            _, oldest = self._outgoing.popitem(last=False)
            self._give_up(oldest.chunks[0].command_id, GiveUp(
                TransferError.LOST, f"{MAX_HELD_TRANSFER_BYTES} bytes of transfers already wait for acknowledgement"))
        self.sent += 1
        self._transmit(outgoing)

    def _transmit(self, outgoing: Outgoing) -> None:
        self.chunks_sent += len(outgoing.chunks)
        self._send(outgoing.node_id, outgoing.chunks)

    def _decide(self, transfer_id: str, outgoing: Outgoing, verdict: Resend | GiveUp | None) -> None:
        if isinstance(verdict, Resend):
            again = outgoing.again(new_id(), self._clock())
            del self._outgoing[transfer_id]
            self._outgoing[again.chunks[0].transfer_id] = again
            self.resent += 1
            logger.warning("task input of command %s sent again to node %s (try %d)",
                           outgoing.chunks[0].command_id, outgoing.node_id, again.tries)
            self._transmit(again)
        elif isinstance(verdict, GiveUp):
            del self._outgoing[transfer_id]
            self._give_up(outgoing.chunks[0].command_id, verdict)

    def _give_up(self, command_id: str, verdict: GiveUp) -> None:
        self.failed += 1
        logger.warning("task input of command %s failed: %s: %s", command_id, verdict.error, verdict.detail)
        self._fail(command_id, verdict.error, verdict.detail)

    def on_ack(self, ack: TaskInputAck) -> None:
        """The serving node's answer to a transfer (one of an unknown transfer is ignored: a
        duplicate, or one given up meanwhile)."""
        outgoing = self._outgoing.get(ack.transfer_id)
        if outgoing is None or outgoing.chunks[0].sha256 != ack.sha256:
            return
        verdict = sender_verdict(outgoing, self._clock(), ack)
        if ack.ok:
            del self._outgoing[ack.transfer_id]
            self.acked += 1
        elif verdict is None:  # a transient refusal: sent again at the deadline
            self._outgoing[ack.transfer_id] = replace(outgoing, last_refusal=f"{ack.error}: {ack.detail}")
        else:
            self._decide(ack.transfer_id, outgoing, verdict)

    def held_bytes(self) -> int:
        return sum(outgoing.size_bytes for outgoing in self._outgoing.values())

    def on_event(self, indexed: IndexedEvent, state: State) -> None:
        if self._held and isinstance(indexed.event, TaskCreated):
            self.flush(state)

    def stats(self) -> dict[str, int]:
        return {"held": len(self._held), "capacity": MAX_HELD_INPUTS, "sent": self.sent, "dropped": self.dropped,
                "awaitingAck": len(self._outgoing), "awaitingAckBytes": self.held_bytes(),
                "maxAwaitingAckBytes": MAX_HELD_TRANSFER_BYTES, "chunksSent": self.chunks_sent,
                "acked": self.acked, "resent": self.resent, "failed": self.failed}


__all__ = ["INPUT_HOLD_S", "MAX_HELD_INPUTS", "Drop", "FailInput", "SendChunks", "SendTo", "TaskInputRelay", "Wait", "input_destination"]
