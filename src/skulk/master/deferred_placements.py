"""Placements the master holds while cluster info is still arriving, instead of dropping them.

An API node checks a placement against its own view before it publishes `PlaceInstance`
and answers the caller with the instance id it chose. Its view can be ahead of the
master's: a node that just joined knows its own resources at once, while the master hears
them with the node's first telemetry. A master that refused such a command as
`placement_info_pending` left the caller holding an instance id that would never appear
(the CI hang of stop 45: a pooled placement made through the node that had just joined).

So a placement the master refuses only because info is pending is held and decided again
on each plan tick, until it is placed, refused for a lasting reason, or DEFER_DEADLINE_S
has passed since its first refusal (then it is dropped and logged). At most
MAX_DEFERRED_PLACEMENTS are held; beyond that the oldest is dropped (counted).

Pure: the shell (`master.main`) passes `now` and does the deciding and logging.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from skulk.master.placement import PlacementInfoPending
from skulk.shared.types.commands import ForwarderCommand, PlaceInstance

DEFER_DEADLINE_S: Final = 30.0
"""How long a placement may wait for pending cluster info (a joining node's first
telemetry takes a few seconds; a partition heals within the chaos suite's budget)."""
MAX_DEFERRED_PLACEMENTS: Final = 64


@dataclass(frozen=True)
class Deferred:
    forwarded: ForwarderCommand
    first_refused_at: float
    reason: str


@dataclass(frozen=True)
class DeferredPlacements:
    held: tuple[Deferred, ...] = ()
    dropped: int = 0
    """Held placements pushed out by the bound."""


def deferrable(forwarded: ForwarderCommand, refusal_code: str) -> bool:
    """A refusal worth waiting out: a placement whose caller was promised an instance id,
    refused only because cluster info is still arriving."""
    command = forwarded.command
    return (isinstance(command, PlaceInstance) and command.instance_id is not None
            and refusal_code == PlacementInfoPending.code)


def defer(held: DeferredPlacements, forwarded: ForwarderCommand, reason: str, now: float,
          first_refused_at: float | None = None) -> tuple[DeferredPlacements, Deferred | None]:
    """Hold `forwarded` (first refused at `first_refused_at`, else now). Returns the new
    holding and the entry dropped for it: the oldest at the bound, or this one when its
    deadline has passed (the caller logs the drop)."""
    entry = Deferred(forwarded, now if first_refused_at is None else first_refused_at, reason)
    if now - entry.first_refused_at >= DEFER_DEADLINE_S:
        return held, entry
    kept = tuple(d for d in held.held if d.forwarded.command.command_id != forwarded.command.command_id)
    dropped = None
    if len(kept) >= MAX_DEFERRED_PLACEMENTS:
        dropped, kept = kept[0], kept[1:]
    return DeferredPlacements((*kept, entry), held.dropped + (dropped is not None)), dropped


def take_all(held: DeferredPlacements) -> tuple[DeferredPlacements, tuple[Deferred, ...]]:
    """Everything held, to decide again now (re-deferred by the shell when still pending)."""
    return dataclasses.replace(held, held=()), held.held


__all__ = ["DEFER_DEADLINE_S", "MAX_DEFERRED_PLACEMENTS", "Deferred", "DeferredPlacements", "defer", "deferrable",
           "take_all"]
