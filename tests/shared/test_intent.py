"""The operator's intent folded from events: placements and custom cards survive repairs,
only an operator's delete withdraws them."""

from __future__ import annotations

import pytest

from skulk.models.cards import builtin_cards_dir, resolve_cards
from skulk.shared.intent import (
    OPERATOR_DELETE_REASON,
    ClusterIntent,
    PlacementIntent,
    excluded_ids,
    fold_intent,
    restore_cards,
    unplaced,
)
from skulk.shared.types.events import (
    CustomModelCardAdded,
    CustomModelCardDeleted,
    InstanceCreated,
    InstanceDeleted,
    InstanceRepairAbandoned,
)
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.state import NodeInfo, State

CARD = next(iter(resolve_cards(builtin_cards_dir(), None).cards.values()))
CUSTOM = CARD.model_copy(update={"model_id": "acme/custom"})
NODES = {"id-a": NodeInfo(node_id="id-a", node_name="alpha", version="0"),
         "id-b": NodeInfo(node_id="id-b", node_name="beta", version="0")}


def _instance(instance_id: str, model: str, nodes: list[str], excluded: tuple[str, ...] = ()) -> Instance:
    return Instance(
        instance_id=instance_id, model_id=model, sharding="Pipeline", context_token_limit=1024,
        excluded_nodes=list(excluded),
        shards=[ShardAssignment(node_id=n, runner_id=f"{instance_id}-{i}", rank=i, world_size=len(nodes),
                                start_layer=i, end_layer=i + 1, backend="cpu") for i, n in enumerate(nodes)],
    )


M1 = _instance("i1", "m1", ["id-a"], excluded=("id-b",))
M1_AGAIN = _instance("i2", "m1", ["id-a"], excluded=("id-b",))
WANT_M1 = PlacementIntent(model_id="m1", min_nodes=1, excluded_node_names=["beta"], kv_cache_type="f16")
HELD = ClusterIntent(placements={"m1": WANT_M1})


def _state(*instances: Instance) -> State:
    return State(nodes=NODES, instances={i.instance_id: i for i in instances})


@pytest.mark.parametrize(
    ("name", "intent", "event", "before", "after", "expected"),
    [
        ("a placement is remembered with exclusions by name", ClusterIntent(),
         InstanceCreated(event_id="e", instance=M1), _state(), _state(M1), HELD),
        ("a repair teardown keeps it", HELD, InstanceDeleted(event_id="e", instance_id="i1", reason="node id-a lost"),
         _state(M1), _state(), HELD),
        ("an abandoned repair keeps it", HELD, InstanceRepairAbandoned(event_id="e", model_id="m1", instance_id="i1",
                                                                      repair_hop=1, reason="fits nowhere"),
         _state(), _state(), HELD),
        ("the operator's delete withdraws it", HELD,
         InstanceDeleted(event_id="e", instance_id="i1", reason=OPERATOR_DELETE_REASON), _state(M1), _state(),
         ClusterIntent()),
        ("unless another instance of the model remains", HELD,
         InstanceDeleted(event_id="e", instance_id="i1", reason=OPERATOR_DELETE_REASON), _state(M1, M1_AGAIN),
         _state(M1_AGAIN), HELD),
        ("a custom card is remembered", ClusterIntent(), CustomModelCardAdded(event_id="e", card=CUSTOM), _state(),
         _state(), ClusterIntent(custom_cards={"acme/custom": CUSTOM})),
        ("and forgotten when deleted", ClusterIntent(custom_cards={"acme/custom": CUSTOM}),
         CustomModelCardDeleted(event_id="e", model_id="acme/custom"), _state(), _state(), ClusterIntent()),
    ],
)
def test_fold_intent(name, intent, event, before, after, expected) -> None:
    assert fold_intent(intent, event, before.instances, after) == expected


def test_exclusions_are_matched_by_name_on_the_nodes_that_came_back() -> None:
    back = State(nodes={"new-b": NodeInfo(node_id="new-b", node_name="beta", version="0"),
                        "new-c": NodeInfo(node_id="new-c", node_name="gamma", version="0")})
    assert excluded_ids(WANT_M1, back) == frozenset({"new-b"})


def test_restore_adds_missing_cards_and_lists_unplaced_models() -> None:
    intent = ClusterIntent(placements={"m1": WANT_M1, "m2": PlacementIntent(model_id="m2")},
                           custom_cards={"acme/custom": CUSTOM})
    events = restore_cards(intent, State(), iter(f"e{i}" for i in range(9)).__next__)
    assert [e.card.model_id for e in events] == ["acme/custom"]
    assert restore_cards(intent, State(custom_cards={"acme/custom": CUSTOM}), lambda: "e") == []
    assert [p.model_id for p in unplaced(intent, _state(M1))] == ["m2"]


def test_the_record_round_trips_through_json() -> None:
    intent = ClusterIntent(placements={"m1": WANT_M1}, custom_cards={"acme/custom": CUSTOM})
    assert ClusterIntent.model_validate_json(intent.model_dump_json(by_alias=True)) == intent
