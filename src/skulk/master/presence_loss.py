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
from typing import Final, Literal

from skulk.shared.types.ids import NodeId

PRESENCE_LOSS_CONFIRM_S: Final = 0.5
"""How long a member's presence must stay gone before it is judged lost. Two zenoh
keep-alive periods (see `routing.router.TRANSPORT_LEASE_MS`): long enough to ride out a
token that is withdrawn and re-declared (a live node whose link dropped and reconnected),
short enough that a frozen node's streams fail within 2 s of the freeze (`detection_s`)."""

PRUNE_WINDOW_S: Final = 120.0
"""The window over which presence-driven prunes of one node are counted."""

MAX_PRESENCE_PRUNES: Final = 2
"""Presence-driven prunes of one node allowed per PRUNE_WINDOW_S. A node lost a third time
within the window is only pruned by the silence timeout: a flapping node costs at most two
fast repairs per two minutes, never a repair storm."""


@dataclass(frozen=True)
class PresenceLedger:
    """What the master remembers about presence between plan passes."""

    absent_since: Mapping[NodeId, float] = field(default_factory=dict[NodeId, float])
    """Members without presence, and when this master first saw each so."""
    pruned_at: Mapping[NodeId, tuple[float, ...]] = field(default_factory=dict[NodeId, tuple[float, ...]])
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


MemberVerdict = Literal["present", "confirming", "lost", "left_to_silence_timeout"]


def member_verdict(absent_for_s: float | None, recent_prunes: int) -> MemberVerdict:
    """Is this member lost? The one decision of fast failure detection.

    - present: it holds a proven presence token (`absent_for_s` is None);
    - confirming: gone for less than PRESENCE_LOSS_CONFIRM_S (a blink, a reconnect);
    - lost: gone past the hysteresis and within its prune budget: prune it now;
    - left_to_silence_timeout: gone, but pruned MAX_PRESENCE_PRUNES times within
      PRUNE_WINDOW_S already (a flapping node): only the silence timeout prunes it.
    """
    if absent_for_s is None:
        return "present"
    if absent_for_s < PRESENCE_LOSS_CONFIRM_S:
        return "confirming"
    return "lost" if recent_prunes < MAX_PRESENCE_PRUNES else "left_to_silence_timeout"


def lost_nodes(ledger: PresenceLedger, now: float) -> dict[NodeId, float]:
    """Members whose verdict is "lost", mapped to how long they have been absent (s)."""
    return {
        node: now - since
        for node, since in sorted(ledger.absent_since.items())
        if member_verdict(now - since, len(ledger.pruned_at.get(node, ()))) == "lost"
    }


def detection_s(lease_s: float, keep_alives_per_lease: int, recheck_margin_s: float) -> tuple[float, float]:
    """(earliest, latest) seconds from a node freezing to the master's prune, as the timers
    add up: the peer's last keep-alive came up to one keep-alive period before the freeze,
    the lease runs out after it, the master's plan pass stamps the absence a margin later
    and judges it a margin after the hysteresis. Scheduling delays come on top (measured by
    bench/failure_detection.py)."""
    keep_alive_s = lease_s / keep_alives_per_lease
    after_lease = 2 * recheck_margin_s + PRESENCE_LOSS_CONFIRM_S
    return lease_s - keep_alive_s + after_lease, lease_s + after_lease


def stall_tolerance_s(lease_s: float, keep_alives_per_lease: int) -> float:
    """The longest a live node may stop entirely (all threads) without its link dropping:
    its peers hear nothing for the stall plus up to one keep-alive period."""
    return lease_s - lease_s / keep_alives_per_lease


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
    "MemberVerdict",
    "PresenceLedger",
    "detection_s",
    "lost_nodes",
    "member_verdict",
    "observe",
    "record_prunes",
    "stall_tolerance_s",
]
