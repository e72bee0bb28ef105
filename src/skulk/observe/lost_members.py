"""Members that left the cluster recently, so cluster diagnostics still list them.

The master prunes a dead node within a second or two (presence loss), which removes it from
State; an operator who captures diagnostics after a crash must still see that node, listed
unreachable with why it left. This keeps, per node, the reason and time of its departure
(`NodeTimedOut` with its cause, or a clean `NodeLeft`) for `LOST_MEMBER_MEMORY_S`, bounded
to `MAX_LOST_MEMBERS`, and forgets a node that comes back. It never calls the network.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from skulk.shared.types.events import IndexedEvent, NodeLeft, NodeTimedOut
from skulk.shared.types.state import State

LOST_MEMBER_MEMORY_S = 600.0
"""How long a departed member stays listed (ten minutes: time to notice and capture)."""

MAX_LOST_MEMBERS = 64
"""Departed members remembered at most; the oldest is forgotten first."""


def departure_reason(event: object) -> str | None:
    """Why a member left, from the event that removed it (None: not a departure). Pure."""
    if isinstance(event, NodeTimedOut):
        cause = getattr(event, "cause", "silence")
        how = "its transport presence was lost" if cause == "presence_lost" else "it fell silent"
        return f"pruned by the master: {how}"
    if isinstance(event, NodeLeft):
        return "it left the cluster (clean stop)"
    return None


class LostMembers:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lost: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def observe(self, indexed: IndexedEvent) -> None:
        event = indexed.event
        reason = departure_reason(event)
        if reason is None or not isinstance(event, NodeTimedOut | NodeLeft):
            return
        node_id = event.node_id
        self._lost.pop(node_id, None)
        self._lost[node_id] = (reason, self._clock())
        while len(self._lost) > MAX_LOST_MEMBERS:
            self._lost.popitem(last=False)

    def recent(self, state: State) -> dict[str, str]:
        """Departed members still worth listing: gone from `state`, left within the memory."""
        now = self._clock()
        for node_id, (_, at) in list(self._lost.items()):
            if now - at > LOST_MEMBER_MEMORY_S or node_id in state.nodes:
                del self._lost[node_id]
        return {node_id: reason for node_id, (reason, _) in self._lost.items()}


__all__ = ["LOST_MEMBER_MEMORY_S", "MAX_LOST_MEMBERS", "LostMembers", "departure_reason"]
