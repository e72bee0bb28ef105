"""Fast failure detection: which members the master may prune because their presence is gone.

Zenoh withdraws a node's liveliness token within a second of its death (at once for a
closed connection, within the transport lease for a frozen process), long before the
30 s silence timeout (`NODE_TIMEOUT_S`). This module turns the presence set into prune
verdicts the master's plan acts on, with two guards against a flapping node:

- hysteresis: a member must stay absent for PRESENCE_LOSS_CONFIRM_S before it is judged,
  so a token that blinks (a reconnect, a restart whose new token lags the old) is no loss;
- a bounded repair rate: at most MAX_PRESENCE_PRUNES per node within PRUNE_WINDOW_S. A node
  that keeps coming and going after that is left to the silence timeout, which stays the
  backstop for every node (presence can also keep a dead node looking alive).

Pure: the shell passes the presence set and its monotonic `now`; no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from skulk.shared.types.ids import NodeId

PRESENCE_LOSS_CONFIRM_S: Final = 0.5
"""How long a member's presence must stay gone before it is judged lost. Two zenoh
keep-alive periods (see `routing.router.TRANSPORT_LEASE_MS`): long enough to ride out a
token that is withdrawn and re-declared, short enough that a stream served by a dead node
fails within about a second."""

PRUNE_WINDOW_S: Final = 120.0
"""The window over which presence-driven prunes of one node are counted."""

MAX_PRESENCE_PRUNES: Final = 2
"""Presence-driven prunes of one node allowed per PRUNE_WINDOW_S. A node lost a third time
within the window is only pruned by the silence timeout: a flapping node costs at most two
fast repairs per two minutes, never a repair storm."""


@dataclass(frozen=True)
class PresenceLedger:
    """What the master remembers about presence between plan passes."""

    absent_since: Mapping[NodeId, float] = field(default_factory=dict)
    """Members without presence, and when this master first saw each so."""
    pruned_at: Mapping[NodeId, tuple[float, ...]] = field(default_factory=dict)
    """Recent presence-driven prunes per node, oldest first (within PRUNE_WINDOW_S)."""


def observe(
    ledger: PresenceLedger, members: Iterable[NodeId], alive: frozenset[str], me: NodeId, now: float
) -> PresenceLedger:
    """Fold the current presence set in: members that are absent keep their first-seen
    time (or start now); present members and non-members are forgotten. The master never
    judges itself. Prunes older than the window are dropped."""
    absent = {
        node: ledger.absent_since.get(node, now)
        for node in members
        if node != me and node not in alive
    }
    pruned = {
        node: recent
        for node, times in ledger.pruned_at.items()
        if (recent := tuple(t for t in times if now - t < PRUNE_WINDOW_S))
    }
    return PresenceLedger(absent_since=absent, pruned_at=pruned)


def lost_nodes(ledger: PresenceLedger, now: float) -> dict[NodeId, float]:
    """Members absent for at least PRESENCE_LOSS_CONFIRM_S and still within their prune
    budget, mapped to how long they have been absent (seconds)."""
    return {
        node: now - since
        for node, since in sorted(ledger.absent_since.items())
        if now - since >= PRESENCE_LOSS_CONFIRM_S and len(ledger.pruned_at.get(node, ())) < MAX_PRESENCE_PRUNES
    }


def record_prunes(ledger: PresenceLedger, nodes: Iterable[NodeId], now: float) -> PresenceLedger:
    """Count a presence-driven prune of each of `nodes` at `now`."""
    pruned = dict(ledger.pruned_at)
    for node in nodes:
        pruned[node] = (*pruned.get(node, ()), now)
    return replace(ledger, pruned_at=pruned)


__all__ = [
    "MAX_PRESENCE_PRUNES",
    "PRESENCE_LOSS_CONFIRM_S",
    "PRUNE_WINDOW_S",
    "PresenceLedger",
    "lost_nodes",
    "observe",
    "record_prunes",
]
