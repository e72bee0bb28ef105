"""The operator's intent: which models the cluster should serve, and its custom model cards.

State forgets everything on a whole-cluster restart (every node starts with an empty replica
and a new node id). The intent survives it: every node folds the events it applies into a
`ClusterIntent` (`fold_intent`) and keeps it on disk (`skulk.datadir.intent_record`); the first
master of a cold start restores it (`restore_events`): custom cards at once, then each
placement by capacity on the nodes that came back, keeping the operator's exclusions by
node *name* (ids change on restart).

What counts as intent is decided by events, not by the current State, so a placement the
cluster cannot serve for a while is not forgotten: an instance torn down for a lost node
and abandoned (`InstanceRepairAbandoned`) is still wanted; only an operator's delete (the
last instance of its model) or card delete removes an entry.

Pure: events and State in, new values out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from pydantic import Field

from skulk.shared.types.base import WireModel
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.common import Sharding
from skulk.shared.types.events import (
    CustomModelCardAdded,
    CustomModelCardDeleted,
    Event,
    InstanceCreated,
    InstanceDeleted,
)
from skulk.shared.types.ids import EventId, InstanceId, ModelId, NodeId
from skulk.shared.types.instances import Instance
from skulk.shared.types.kv_cache import KvCacheType
from skulk.shared.types.state import State

OPERATOR_DELETE_REASON: Final = "deleted by operator"
"""`InstanceDeleted.reason` of an operator's delete (master.commands): the only deletion
that withdraws intent. Every other deletion is a repair, which keeps it."""


class PlacementIntent(WireModel):
    """One model the operator placed, as it can be placed again on nodes with new ids."""

    model_id: str
    sharding: Sharding = "Pipeline"
    min_nodes: int = Field(default=1, ge=1)
    excluded_node_names: list[str] = Field(default_factory=list)
    slots: int | None = Field(default=None, ge=1)
    """The operator's slot count for the placement (`Instance.requested_slots`), if any."""
    kv_cache_type: KvCacheType | None = None
    """The KV cache type the placement was admitted with (its shards'); None in older intents."""


class ClusterIntent(WireModel):
    placements: dict[str, PlacementIntent] = Field(default_factory=dict)
    """By model id: one wanted placement per model."""
    custom_cards: dict[str, ModelCard] = Field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.placements or self.custom_cards)


def placement_intent(instance: Instance, state: State) -> PlacementIntent:
    """What to ask for again: the instance's model, sharding, width and exclusions by name
    (an excluded node State no longer names is kept by id, which never matches again)."""
    names = [state.nodes[n].node_name if n in state.nodes else n for n in instance.excluded_nodes]
    return PlacementIntent(
        model_id=instance.model_id, sharding=instance.sharding, min_nodes=len(set(instance.node_ids())),
        excluded_node_names=sorted(set(names)), slots=instance.requested_slots,
        kv_cache_type=instance.shards[0].kv_cache_type,
    )


def fold_intent(
    intent: ClusterIntent, event: Event, before: Mapping[InstanceId, Instance], after: State
) -> ClusterIntent:
    """The intent after `event`: `before` is State's instances before it applied, `after`
    the State it gave."""
    if isinstance(event, InstanceCreated):
        wanted = placement_intent(event.instance, after)
        if intent.placements.get(wanted.model_id) == wanted:
            return intent
        return intent.model_copy(update={"placements": {**intent.placements, wanted.model_id: wanted}})
    if isinstance(event, InstanceDeleted) and event.reason == OPERATOR_DELETE_REASON:
        gone = before.get(event.instance_id)
        if gone is None or any(i.model_id == gone.model_id for i in after.instances.values()):
            return intent
        return intent.model_copy(update={"placements": _without(intent.placements, gone.model_id)})
    if isinstance(event, CustomModelCardAdded):
        if intent.custom_cards.get(event.card.model_id) == event.card:
            return intent
        return intent.model_copy(update={"custom_cards": {**intent.custom_cards, event.card.model_id: event.card}})
    if isinstance(event, CustomModelCardDeleted) and event.model_id in intent.custom_cards:
        return intent.model_copy(update={"custom_cards": _without(intent.custom_cards, event.model_id)})
    return intent


def _without(mapping: Mapping[str, object], key: str) -> dict[str, object]:
    return {k: v for k, v in mapping.items() if k != key}


# -- restoring on a cold start ------------------------------------------------------------


def restore_cards(intent: ClusterIntent, state: State, new_id: Callable[[], str]) -> list[Event]:
    """CustomModelCardAdded for every remembered card State does not hold (in id order)."""
    return [
        CustomModelCardAdded(event_id=EventId(new_id()), card=card)
        for model_id, card in sorted(intent.custom_cards.items())
        if state.custom_cards.get(ModelId(model_id)) != card
    ]


def excluded_ids(wanted: PlacementIntent, state: State) -> frozenset[NodeId]:
    """The current ids of the nodes the operator excluded, matched by name."""
    names = set(wanted.excluded_node_names)
    return frozenset(n for n, info in state.nodes.items() if info.node_name in names)


def unplaced(intent: ClusterIntent, state: State) -> list[PlacementIntent]:
    """Remembered placements whose model has no instance in State, in model order."""
    placed = {i.model_id for i in state.instances.values()}
    return [p for m, p in sorted(intent.placements.items()) if m not in placed]


__all__ = [
    "OPERATOR_DELETE_REASON",
    "ClusterIntent",
    "PlacementIntent",
    "excluded_ids",
    "fold_intent",
    "placement_intent",
    "restore_cards",
    "unplaced",
]
