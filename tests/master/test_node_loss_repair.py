"""Re-placement after a lost node: the master tears the instance down and places the model again
on the survivors (same sharding, original width first, then narrower), or records why not.
Tables over hand-built State; no processes, no clock."""

import pytest

from skulk.master.plan import MasterView, plan
from skulk.master.repair import node_loss_attempts
from skulk.shared.apply import apply_all
from skulk.shared.telemetry_view import NodeFreshness
from skulk.shared.types.events import (
    InstanceCreated,
    InstanceDeleted,
    InstanceRepairAbandoned,
    NodeTimedOut,
    TaskFailed,
)
from skulk.shared.types.instances import RunnerStatus
from tests.master.test_repair import (
    CARDS,
    GB,
    LLAMA_CPU,
    MLX,
    _indexed,
    created,
    ids,
    instance_on,
    res,
    state_with,
    task_on,
)

DEAD = NodeFreshness(heartbeat_age_s=31.0, telemetry_age_s=40.0, last_event_age_s=90.0)
FRESH = NodeFreshness(heartbeat_age_s=1.0, telemetry_age_s=1.0, last_event_age_s=1.0)
AB = instance_on(MLX, ["a", "b"])
ROOMY = 8 * GB
HALVES_ONLY = int(1.3 * GB)  # the 1.6 GB model fits nowhere whole; its halves fit


def view(state, resources, lost=("a",)):
    freshness = {n: DEAD if n in lost else FRESH for n in state.nodes}
    return MasterView(state=state, me="m", freshness=freshness, cards=CARDS, resources=resources)


def roomy(*nodes):
    return {n: res(n, ROOMY) for n in nodes}


def ready(instance, *nodes):
    return {s.runner_id: RunnerStatus(state="Ready") for s in instance.shards if s.node_id in nodes}


CASES = [
    # name, instance, members, resources, runners, expected node set (None: abandoned)
    ("same width on the survivors", AB, "abc", roomy(*"abc"), {}, {"b", "c"}),
    ("narrower: one survivor left", AB, "ab", roomy(*"ab"), {}, {"b"}),
    ("narrower: a survivor cannot run the engine", AB, "abc",
     {**roomy(*"ab"), "c": res("c", ROOMY, LLAMA_CPU)}, {}, {"b"}),
    ("nothing fits: abandoned, nothing placed", AB, "ab", {n: res(n, HALVES_ONLY) for n in "ab"}, {}, None),
    ("the survivor's own shard is credited back", AB, "ab", {n: res(n, HALVES_ONLY) for n in "ab"},
     ready(AB, "b"), {"b"}),
    ("the lost node's shard is never credited", AB, "ab", {n: res(n, HALVES_ONLY) for n in "ab"},
     ready(AB, "a"), None),
    ("wider is never tried", instance_on(MLX, ["a"]), "abc", roomy(*"abc"), {}, {"b"}),
]


@pytest.mark.parametrize(("name", "inst", "nodes", "resources", "runners", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_a_timed_out_node_is_replaced_on_the_survivors(name, inst, nodes, resources, runners, expected):
    state = state_with(inst, tuple(nodes), runners=runners)
    events = plan(view(state, resources), ids())
    kinds = [type(e).__name__ for e in events]
    assert kinds[:2] == ["InstanceDeleted", "NodeTimedOut"]
    if expected is None:
        assert kinds[2:] == ["InstanceRepairAbandoned"]
        abandoned = events[-1]
        assert abandoned.instance_id == inst.instance_id and abandoned.node_id == "a"
        assert "node a timed out" in abandoned.reason and "no placement on the survivors" in abandoned.reason
    else:
        assert kinds[2:] == ["InstanceCreated"]
        placed = created(events)
        assert set(placed.node_ids()) == expected and "a" not in placed.node_ids()
        assert placed.sharding == inst.sharding and placed.model_id == inst.model_id


def test_a_departed_node_is_replaced_too():
    state = state_with(AB, ("b", "c"))  # a left: no longer a member
    events = plan(view(state, roomy(*"abc"), lost=()), ids())
    assert [type(e).__name__ for e in events] == ["InstanceDeleted", "InstanceCreated"]
    assert set(created(events).node_ids()) == {"b", "c"}


def test_operator_exclusions_survive_and_the_lost_node_is_not_stamped():
    inst = instance_on(MLX, ["a", "b"], excluded=["d"])
    state = state_with(inst, tuple("abcd"))
    placed = created(plan(view(state, roomy(*"abcd")), ids()))
    assert set(placed.node_ids()) == {"b", "c"}
    assert placed.excluded_nodes == ["d"]


def test_failures_then_deletes_then_the_node_then_the_new_instance_and_never_again():
    state = state_with(AB, tuple("abc"), tasks=[task_on(AB)])
    resources = roomy(*"abc")
    events = plan(view(state, resources), ids())
    assert [type(e).__name__ for e in events] == ["TaskFailed", "InstanceDeleted", "NodeTimedOut", "InstanceCreated"]
    failed = events[0]
    assert isinstance(failed, TaskFailed) and failed.error_type == "NodeLost" and "node a lost" in failed.error_message
    assert isinstance(events[1], InstanceDeleted) and isinstance(events[2], NodeTimedOut)
    after = apply_all(state.model_copy(update={"last_event_applied_idx": -1}), _indexed(events, 0))
    assert "a" not in after.nodes and AB.instance_id not in after.instances
    (new,) = after.instances.values()
    assert set(new.node_ids()) == {"b", "c"}
    fresh = {n: FRESH for n in after.nodes}
    assert plan(MasterView(state=after, me="m", freshness=fresh, cards=CARDS, resources=resources), ids()) == []


def test_two_instances_in_one_pass_do_not_count_on_the_same_memory():
    one, two = instance_on(MLX, ["a"], instance_id="i1"), instance_on(MLX, ["a"], instance_id="i2")
    state = state_with(one, tuple("abc")).model_copy(update={"instances": {"i1": one, "i2": two}})
    resources = {"a": res("a", ROOMY), "b": res("b", 2 * GB), "c": res("c", 2 * GB)}  # one model each
    events = plan(view(state, resources), ids())
    placed = [e.instance for e in events if isinstance(e, InstanceCreated)]
    assert len(placed) == 2 and {p.node_ids()[0] for p in placed} == {"b", "c"}


def test_abandoned_when_every_survivor_is_excluded():
    inst = instance_on(MLX, ["a", "b"], excluded=["c"])
    events = plan(view(state_with(inst, tuple("abc")), roomy(*"abc"), lost=("a", "b")), ids())
    abandoned = [e for e in events if isinstance(e, InstanceRepairAbandoned)]
    assert len(abandoned) == 1 and abandoned[0].node_id is None  # two nodes lost: nobody to blame alone
    assert not any(isinstance(e, InstanceCreated) for e in events)


@pytest.mark.parametrize(
    ("sharding", "width", "expected"),
    [("Pipeline", 2, [(2, "Pipeline"), (1, "Pipeline")]),
     ("Tensor", 3, [(3, "Tensor"), (2, "Tensor"), (1, "Pipeline")])],
)
def test_node_loss_attempts_go_from_the_width_down_to_one(sharding, width, expected):
    inst = instance_on(MLX, list("abc"[:width]), hop=1, excluded=["z"]).model_copy(update={"sharding": sharding})
    attempts = node_loss_attempts(inst, ["a"])
    assert [(r.min_nodes, r.sharding) for _, r in attempts] == expected
    assert all(r.max_nodes == r.min_nodes and r.excluded_nodes == {"a", "z"} for _, r in attempts)
    assert all(hop == 1 for hop, _ in attempts)  # a loss is not a refusal: the hop is kept
