"""A runner its worker gave up on (the crash breaker tripped while its node stays up): the
master re-places the instance away from that node, one repair hop further, the node stamped
as an exclusion; when nothing else admits it, the instance is kept Failed with the reason in
State, and the master does not decide again. Tables over hand-built State; no processes."""

import pytest

from skulk.master.plan import BROKEN_GROUP_GRACE_S, MasterView, plan, track_broken_groups
from skulk.master.repair import RUNNER_CRASHED, given_up_runners
from skulk.shared.apply import apply_all
from skulk.shared.serving import model_serving
from skulk.shared.telemetry_view import NodeFreshness
from skulk.shared.types.instances import MAX_REPAIR_HOP, RunnerStatus
from skulk.shared.types.state import RepairFailure
from tests.master.test_repair import CARDS, GB, MLX, _indexed, created, ids, instance_on, res, state_with, task_on

FRESH = NodeFreshness(heartbeat_age_s=1.0, telemetry_age_s=1.0, last_event_age_s=1.0)
ROOMY = {n: res(n, 8 * GB) for n in "abc"}
GAVE_UP = RunnerStatus(state="Failed", gave_up=True,
                       error_message="keeps failing; last failure: runner exited with code -9")


def status_by_node(instance, **states: RunnerStatus) -> dict[str, RunnerStatus]:
    by_node = {s.node_id: s.runner_id for s in instance.shards}
    return {by_node[n]: status for n, status in states.items()}


def view(state, resources=ROOMY, broken_for=0.0):
    return MasterView(state=state, me="m", freshness={n: FRESH for n in state.nodes}, now=100.0, cards=CARDS,
                      resources=resources, broken_since=track_broken_groups(state, {}, now=100.0 - broken_for))


def kinds(events) -> list[str]:
    return [type(e).__name__ for e in events]


ON_A = instance_on(MLX, ["a"])


@pytest.mark.parametrize(
    ("name", "instance", "nodes", "statuses", "resources", "expected_kinds", "expected_nodes", "expected_hop"),
    [
        ("single node: re-placed on another node, one hop further",
         ON_A, "ab", {"a": GAVE_UP}, ROOMY,
         ["TaskFailed", "InstanceDeleted", "InstanceCreated"], ["b"], 1),
        ("a two-node group whose rank never served: same width without the failing node",
         instance_on(MLX, ["a", "b"]), "abc", {"a": RunnerStatus(state="Loading"), "b": GAVE_UP}, ROOMY,
         ["TaskFailed", "InstanceDeleted", "InstanceCreated"], ["a", "c"], 1),
        ("only a narrower placement fits: narrower",
         instance_on(MLX, ["a", "b"]), "ab", {"b": GAVE_UP}, ROOMY,
         ["TaskFailed", "InstanceDeleted", "InstanceCreated"], ["a"], 1),
        ("no other node admits it: kept Failed, the reason recorded",
         ON_A, "ab", {"a": GAVE_UP}, {"a": res("a", 8 * GB), "b": res("b", 1)},
         ["InstanceRepairAbandoned"], None, None),
        ("alone in the cluster: kept Failed",
         ON_A, "a", {"a": GAVE_UP}, ROOMY, ["InstanceRepairAbandoned"], None, None),
        ("at the last hop: kept Failed, not re-placed",
         instance_on(MLX, ["a"], hop=MAX_REPAIR_HOP), "ab", {"a": GAVE_UP}, ROOMY,
         ["InstanceRepairAbandoned"], None, None),
        ("Failed, but the worker will restart it: left alone",
         ON_A, "ab", {"a": RunnerStatus(state="Failed", error_message="runner exited with code -9")}, ROOMY,
         [], None, None),
        ("serving: left alone", ON_A, "ab", {"a": RunnerStatus(state="Ready")}, ROOMY, [], None, None),
    ],
)
def test_given_up_repair(name, instance, nodes, statuses, resources, expected_kinds, expected_nodes, expected_hop):
    state = state_with(instance, tuple(nodes), runners=status_by_node(instance, **statuses), tasks=[task_on(instance)])
    events = plan(view(state, resources), ids())
    assert kinds(events) == expected_kinds, name
    new = created(events)
    if expected_nodes is None:
        assert new is None
        return
    assert new is not None and new.node_ids() == expected_nodes and new.repair_hop == expected_hop
    failing = [n for n, s in statuses.items() if s.gave_up]
    assert set(failing) <= set(new.excluded_nodes)  # never back onto the node that kept failing
    assert new.instance_id != instance.instance_id


def test_open_requests_fail_typed_naming_the_rank_and_node_before_the_delete():
    state = state_with(ON_A, ("a", "b"), runners=status_by_node(ON_A, a=GAVE_UP), tasks=[task_on(ON_A)])
    failed, deleted, _created = plan(view(state), ids())
    assert failed.error_type == RUNNER_CRASHED
    assert "rank 0 on node a keeps failing: keeps failing; last failure: runner exited with code -9" in failed.error_message
    assert deleted.instance_id == ON_A.instance_id


def test_the_operators_exclusions_survive_and_the_failing_node_is_added():
    mine = instance_on(MLX, ["a"], excluded=("c",))
    state = state_with(mine, ("a", "b", "c"), runners=status_by_node(mine, a=GAVE_UP))
    new = created(plan(view(state), ids()))
    assert new is not None and new.node_ids() == ["b"] and new.excluded_nodes == ["a", "c"]


def test_kept_failed_instances_are_refused_typed_with_the_reason_and_never_reconsidered():
    state = state_with(ON_A, ("a",), runners=status_by_node(ON_A, a=GAVE_UP))
    events = plan(view(state), ids())
    (abandoned,) = events
    assert abandoned.node_id == "a" and abandoned.instance_id == ON_A.instance_id
    assert "stays Failed until an operator places it again" in abandoned.reason
    after = apply_all(state, _indexed(events, state.last_event_applied_idx + 1))
    assert ON_A.instance_id in after.instances  # kept: a typed refusal, not "not placed"
    assert after.repair_failures[MLX.model_id].instance_id == ON_A.instance_id
    verdict = model_serving(after, MLX.model_id)
    assert verdict.refused and "is Failed (keeps failing; last failure: runner exited with code -9)" in verdict.refusal()
    assert plan(view(after), ids()) == []  # no repair storm: decided once


def test_an_abandoned_record_of_another_instance_does_not_block_the_repair():
    old = RepairFailure(instance_id="older", node_id="c", repair_hop=2, reason="earlier")
    state = state_with(ON_A, ("a", "b"), runners=status_by_node(ON_A, a=GAVE_UP))
    state = state.model_copy(update={"repair_failures": {MLX.model_id: old}})
    assert "InstanceCreated" in kinds(plan(view(state), ids()))


def test_a_group_that_broke_while_serving_is_left_to_the_broken_group_rule():
    ab = instance_on(MLX, ["a", "b"])
    served = GAVE_UP.model_copy(update={"served": True})
    state = state_with(ab, ("a", "b"), runners=status_by_node(ab, a=RunnerStatus(state="Ready"), b=served))
    assert given_up_runners(state, ab) == []
    assert plan(view(state, broken_for=0.0), ids()) == []  # inside the broken group's grace: nobody acts
    assert kinds(plan(view(state, broken_for=BROKEN_GROUP_GRACE_S), ids()))[-1] == "InstanceCreated"
