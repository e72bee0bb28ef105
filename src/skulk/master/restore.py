"""Re-placing the operator's remembered placements on the first master of a cold start.

The nodes that come back have new ids, and may be fewer or different: each remembered
placement (`skulk.shared.intent.PlacementIntent`) is placed again by capacity with the
ordinary planner, its exclusions matched by node name. One placement per pass, so the next
one is planned on a State that already holds the previous (memory is never double-booked).
A placement that does not fit at its old width is tried on one node once RESTORE_NARROW_AFTER_S
have passed; one that fits nowhere by RESTORE_DEADLINE_S is given up (the shell logs it).

Pure: State, cards and resources in, events out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from skulk.master.placement import PlacementError, PlacementRequest, place
from skulk.shared.intent import PlacementIntent, excluded_ids
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.events import InstanceCreated
from skulk.shared.types.ids import EventId, ModelId, NodeId
from skulk.shared.types.state import State
from skulk.shared.types.telemetry import NodeResources

RESTORE_NARROW_AFTER_S: Final = 30.0
"""How long a restored placement waits for enough nodes to come back to place it at its
old width before it is placed on a single node (if the model fits one)."""

RESTORE_DEADLINE_S: Final = 180.0
"""How long after promotion the master keeps trying to restore placements. Long enough for
a whole rack to boot; a model that fits nowhere by then is reported and left to the operator."""


@dataclass(frozen=True)
class RestoreStep:
    created: InstanceCreated | None
    """The one placement made this pass, if any."""
    waiting: tuple[tuple[PlacementIntent, str], ...]
    """Placements still to make, each with why it does not fit yet."""


def restore_step(
    pending: list[PlacementIntent],
    state: State,
    cards: Mapping[ModelId, ModelCard],
    resources: Mapping[NodeId, NodeResources],
    *,
    waited_s: float,
    new_id: Callable[[], str],
    memory_credits: Mapping[NodeId, int] | None = None,
) -> RestoreStep:
    """Place the first pending placement that fits now (placements already in State count
    as done); the rest wait, with the planner's reason."""
    placed_models = {i.model_id for i in state.instances.values()}
    waiting: list[tuple[PlacementIntent, str]] = []
    created: InstanceCreated | None = None
    for wanted in pending:
        if wanted.model_id in placed_models:
            continue
        if created is not None:
            waiting.append((wanted, "after the previous restored placement"))
            continue
        widths = [wanted.min_nodes] + ([1] if wanted.min_nodes > 1 and waited_s >= RESTORE_NARROW_AFTER_S else [])
        reason = ""
        for width in widths:
            request = PlacementRequest(model_id=ModelId(wanted.model_id), sharding=wanted.sharding, min_nodes=width,
                                       excluded_nodes=excluded_ids(wanted, state), max_nodes=None if width > 1 else 1,
                                       slots=wanted.slots, kv_cache_type=wanted.kv_cache_type)
            try:
                instance = place(cards.get(ModelId(wanted.model_id)), state, resources, request, new_id=new_id,
                                 memory_credits=memory_credits or {})
            except PlacementError as exc:
                reason = str(exc)
                continue
            created = InstanceCreated(event_id=EventId(new_id()), instance=instance)
            break
        if created is None:
            waiting.append((wanted, reason))
    return RestoreStep(created=created, waiting=tuple(waiting))


__all__ = ["RESTORE_DEADLINE_S", "RESTORE_NARROW_AFTER_S", "RestoreStep", "restore_step"]
