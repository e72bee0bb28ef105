"""A multi-rank group that was serving loses a rank while every node stays up (a runner
crashed or was killed): after a short grace the master re-places it at the same width under a
fresh id (fresh ring ports), one repair hop further, and gives up past the last hop. Tables
over hand-built State; no processes, no clock."""

import pytest

from skulk.master.plan import BROKEN_GROUP_GRACE_S, MasterView, plan, track_broken_groups
from skulk.master.repair import GROUP_BROKEN, broken_group_failures
from skulk.shared.telemetry_view import NodeFreshness
from skulk.shared.types.events import InstanceCreated, InstanceDeleted, InstanceRepairAbandoned, TaskFailed
from skulk.shared.types.instances import MAX_REPAIR_HOP, RunnerStatus
from tests.master.test_repair import CARDS, GB, MLX, ids, instance_on, res, state_with, task_on

FRESH = NodeFreshness(heartbeat_age_s=1.0, telemetry_age_s=1.0, last_event_age_s=1.0)
SILENT = NodeFreshness(heartbeat_age_s=BROKEN_GROUP_GRACE_S + 1, telemetry_age_s=BROKEN_GROUP_GRACE_S + 1,
                       last_event_age_s=20.0)
AB = instance_on(MLX, ["a", "b"])
ROOMY = {n: res(n, 8 * GB) for n in "ab"}


def runners(instance, served=True, **states):
    """Runner statuses by node name: a="Ready", b="Failed" (after serving unless served=False)."""
    by_node = {s.node_id: s.runner_id for s in instance.shards}
    return {by_node[n]: RunnerStatus(state=st, error_message="killed" if st == "Failed" else None,
                                     served=served and st == "Failed")
            for n, st in states.items()}


def view(state, *, broken_for=BROKEN_GROUP_GRACE_S, freshness=None, resources=ROOMY):
    return MasterView(
        state=state, me="m", freshness=freshness or {n: FRESH for n in state.nodes}, now=100.0,
        cards=CARDS, resources=resources,
        broken_since=track_broken_groups(state, {}, now=100.0 - broken_for),
    )


def test_a_serving_group_with_a_failed_rank_is_replaced_under_a_fresh_id_one_hop_further():
    state = state_with(AB, ("a", "b"), runners=runners(AB, a="Ready", b="Failed"), tasks=[task_on(AB)])
    events = plan(view(state), ids())
    assert [type(e) for e in events] == [TaskFailed, InstanceDeleted, InstanceCreated]
    failed, _, created = events
    assert failed.error_type == GROUP_BROKEN
    assert "rank 1 on node b failed: killed" in failed.error_message
    new = created.instance
    assert new.instance_id != AB.instance_id  # fresh id: the runners derive fresh ring ports
    assert len(new.shards) == 2 and new.sharding == AB.sharding and new.repair_hop == AB.repair_hop + 1


@pytest.mark.parametrize(
    ("name", "state_runners", "view_kwargs"),
    [
        ("failed before serving (a refusal or a failed download is another rule's)",
         {"a": "Loading", "b": "Failed", "served": False}, {}),
        ("inside the grace", {"a": "Ready", "b": "Failed"}, {"broken_for": BROKEN_GROUP_GRACE_S - 0.5}),
        ("a node of the group went silent: node loss, not a broken group",
         {"a": "Ready", "b": "Failed"}, {"freshness": {"a": FRESH, "b": SILENT}}),
        ("no failed rank", {"a": "Ready", "b": "Ready"}, {}),
    ],
)
def test_left_alone(name, state_runners, view_kwargs):
    state = state_with(AB, ("a", "b"), runners=runners(AB, **state_runners))
    assert plan(view(state, **view_kwargs), ids()) == []


def test_a_group_that_breaks_at_the_last_hop_is_abandoned_not_replaced():
    last = instance_on(MLX, ["a", "b"], hop=MAX_REPAIR_HOP)
    state = state_with(last, ("a", "b"), runners=runners(last, a="Failed", b="Failed"))
    events = plan(view(state), ids())
    assert [type(e) for e in events] == [InstanceDeleted, InstanceRepairAbandoned]
    assert "the last: giving up" in events[-1].reason and events[-1].node_id is None


def test_no_room_left_is_abandoned_with_the_placement_reason():
    state = state_with(AB, ("a", "b"), runners=runners(AB, a="Ready", b="Failed"))
    events = plan(view(state, resources={n: res(n, 1) for n in "ab"}), ids())
    assert [type(e) for e in events] == [InstanceDeleted, InstanceRepairAbandoned]
    assert events[-1].node_id == "b" and "no re-placement" in events[-1].reason


def test_single_rank_instances_are_never_broken_groups():
    one = instance_on(MLX, ["a"])
    state = state_with(one, ("a",), runners=runners(one, a="Failed"))
    assert broken_group_failures(state, one) == []


def test_tracking_keeps_the_first_failure_time_until_the_group_is_gone_or_whole():
    serving = state_with(AB, ("a", "b"), runners=runners(AB, a="Ready", b="Running"))
    broken = state_with(AB, ("a", "b"), runners=runners(AB, a="Ready", b="Failed"))
    first = track_broken_groups(broken, {}, now=10.0)
    assert first == {AB.instance_id: 10.0}
    assert track_broken_groups(broken, first, now=12.0) == {AB.instance_id: 10.0}
    assert track_broken_groups(serving, first, now=13.0) == {}
    before_serving = state_with(AB, ("a", "b"), runners=runners(AB, served=False, a="Loading", b="Failed"))
    assert track_broken_groups(before_serving, {}, now=14.0) == {}
