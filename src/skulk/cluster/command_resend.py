"""The API side of never losing a request's command: publish it again until its task is logged.

An API node publishes `GenerateText` / `RunWorkload` on the COMMANDS topic once, and pub/sub keeps
no history. A command published while no master listens is gone: the old master just died
and this node has not noticed yet, or (the chaos suite's CI hang) this node already follows
a new master whose command subscription is not up yet. Clients that got `MasterFailover`
retry at once and land in exactly that window; their requests then waited for the
two-minute first-frame deadline with no byte sent, far past any client's timeout.

So every generation or embedding command stays tracked while its stream waits for its first
frame, and is published again every COMMAND_RESEND_S while no task for it is in State. The
master binds a command at most once (`skulk.master.commands` ignores a command whose task it
already has), so a copy that crosses the original is harmless. A command whose task is
logged stays tracked until its stream starts: a new master seeded from a replica that had
not seen the task (its snapshot lacks it) gets the command again. Tracking ends when the
stream starts or ends (its first-frame deadline bounds the resends).

`resend_plan` is the pure decision; `CommandResender` holds the commands (bounded) and
returns those to publish again; the node's shell publishes them in order, awaited, on its
one-second housekeeping tick.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from skulk.shared.types.commands import Command, GenerateText, RunWorkload
from skulk.shared.types.state import State

logger = logging.getLogger(__name__)

COMMAND_RESEND_S = 2.0
"""How long a command may go without its task appearing in State before it is published
again. A master logs a command within milliseconds; this only fires when one was lost."""

MAX_TRACKED_COMMANDS = 512
"""Commands tracked per API node (twice its open-stream bound); past it the oldest goes, and
its request falls back on its first-frame deadline."""


@dataclass(frozen=True)
class ResendPlan:
    resend: tuple[str, ...] = ()
    """Commands to publish again now (their task is still not logged)."""
    forget: tuple[str, ...] = ()
    """Commands no longer tracked: their stream started (a runner took it) or ended."""


def logged_commands(state: State) -> frozenset[str]:
    """The command ids that have a task in State."""
    return frozenset(command for task in state.tasks.values() if (command := getattr(task, "command_id", None)))


def resend_plan(
    sent_at: Mapping[str, float], logged: frozenset[str], waiting: frozenset[str], now: float,
    interval_s: float = COMMAND_RESEND_S,
) -> ResendPlan:
    """Which tracked commands (command id -> when last published) to publish again and which
    to stop tracking. `waiting`: the streams still open with no first frame. A command whose
    stream no longer waits is forgotten; one with no task in State (`logged`) that was
    published at least `interval_s` ago is resent; a logged one is kept, unsent."""
    forget = tuple(c for c in sent_at if c not in waiting)
    resend = tuple(c for c, at in sent_at.items()
                   if c in waiting and c not in logged and now - at >= interval_s)
    return ResendPlan(resend=resend, forget=forget)


class CommandResender:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tracked: OrderedDict[str, tuple[GenerateText | RunWorkload, float]] = OrderedDict()
        self.resent = 0
        self.dropped = 0

    def published(self, command: Command) -> None:
        """`command` was just published: track it if it opens a stream (generation, embedding)."""
        if not isinstance(command, (GenerateText, RunWorkload)):
            return
        if command.command_id not in self._tracked and len(self._tracked) >= MAX_TRACKED_COMMANDS:
            self._tracked.popitem(last=False)
            self.dropped += 1
        self._tracked[command.command_id] = (command, self._clock())

    def tick(self, state: State, waiting: Iterable[str]) -> list[GenerateText | RunWorkload]:
        """Forget what is settled; the commands to publish again now (still missing from
        State). `waiting`: the open streams with no first frame yet."""
        if not self._tracked:
            return []
        now = self._clock()
        plan = resend_plan({c: at for c, (_, at) in self._tracked.items()}, logged_commands(state),
                           frozenset(waiting), now)
        for command_id in plan.forget:
            self._tracked.pop(command_id, None)
        resend = []
        for command_id in plan.resend:
            command, _ = self._tracked[command_id]
            self._tracked[command_id] = (command, now)
            self.resent += 1
            logger.warning("command %s (%s) has no task in the cluster's log yet; publishing it again",
                           command_id, command.type)
            resend.append(command)
        return resend

    def stats(self) -> dict[str, int]:
        return {"tracked": len(self._tracked), "capacity": MAX_TRACKED_COMMANDS, "resent": self.resent,
                "dropped": self.dropped}


__all__ = ["COMMAND_RESEND_S", "MAX_TRACKED_COMMANDS", "CommandResender", "ResendPlan", "logged_commands",
           "resend_plan"]
