"""The reducer, one event type at a time: what each fact does to State, and what it must not."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.apply import EVENT_TYPES, EventOutOfOrder, apply, apply_all, state_hash
from skulk.shared.codec import canonical_bytes
from skulk.shared.types.common import Edge, NetworkInterface
from skulk.shared.types.events import (
    CustomModelCardAdded,
    CustomModelCardDeleted,
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    InstancePlacementRefused,
    InstanceRepairAbandoned,
    NodeJoined,
    NodeLeft,
    NodeNetworkUpdated,
    NodeTimedOut,
    RunnerDeleted,
    RunnerStatusUpdated,
    StagedModelEvicted,
    TaskAcknowledged,
    TaskCreated,
    TaskDeleted,
    TaskFailed,
    TaskStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
    TracingStateChanged,
)
from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import (
    DownloadStatusCompleted,
    DownloadStatusFailed,
    DownloadStatusPending,
    NodeInfo,
    RepairFailure,
    State,
)
from skulk.shared.types.tasks import EmbeddingParams, WorkloadTask

CARD = load_card(builtin_cards_dir() / "local--tiny-llama.toml")

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
OUTSIDER = "master-x"  # an origin that is not a member, so last_seen stays put
M = "m"


def _instance(instance_id: str, nodes: list[str], runners: list[str]) -> Instance:
    n = len(nodes)
    return Instance(
        instance_id=instance_id,
        model_id=M,
        sharding="Pipeline",
        shards=[
            ShardAssignment(
                node_id=node, runner_id=runner, rank=i, world_size=n,
                start_layer=i * 4, end_layer=i * 4 + 4, backend="llama_cpp-cpu",
            )
            for i, (node, runner) in enumerate(zip(nodes, runners, strict=True))
        ],
        context_token_limit=8192,
    )


I1 = _instance("i1", ["n1", "n2"], ["r1", "r2"])
I2 = _instance("i2", ["n3"], ["r3"])
E12 = Edge(source="n1", sink="n2", kind="session")
E21 = Edge(source="n2", sink="n1", kind="probed", address="10.0.0.1:52415")
E2G = Edge(source="n2", sink="ghost", kind="session")
PENDING = WorkloadTask(owner_node_id="n1", task_id="t1", instance_id="i1", command_id="c1", params=EmbeddingParams(model_id=M, inputs=["x"]))
DONE = PENDING.model_copy(update={"task_id": "t2", "command_id": "c2", "status": "Complete"})
NEW_TASK = PENDING.model_copy(update={"task_id": "t9", "command_id": "c9"})
LAN = [NetworkInterface(name="en0", addresses=["10.0.0.1"], kind="ethernet")]

BASE = State(
    nodes={
        "n1": NodeInfo(node_id="n1", node_name="one", version="1", last_seen=T0),
        "n2": NodeInfo(node_id="n2", node_name="two", version="1"),
    },
    edges=[E12, E21, E2G],
    node_network={"n1": LAN, "n2": LAN},
    instances={"i1": I1},
    runners={"r1": RunnerStatus(state="Ready"), "r2": RunnerStatus(state="Loading")},
    tasks={"t1": PENDING, "t2": DONE},
    downloads={
        "n1": {M: DownloadStatusCompleted(attempt_id="a1", total_bytes=10)},
        "n2": {
            M: DownloadStatusCompleted(attempt_id="a2", total_bytes=10),
            "other": DownloadStatusFailed(attempt_id="a3", error_message="disk full"),
        },
    },
    last_event_applied_idx=4,
)


def _at(event: Event, idx: int | None = None, origin: str = OUTSIDER, at: datetime = T0) -> IndexedEvent:
    next_idx = BASE.last_event_applied_idx + 1 if idx is None else idx
    return IndexedEvent(idx=next_idx, origin=origin, indexed_at=at, event=event)


def _expect(**update: object) -> State:
    return BASE.model_copy(update={"last_event_applied_idx": 5, **update})


def _without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


def _task(task, **update):  # type: ignore[no-untyped-def]
    return task.model_copy(update=update)


# (event, expected state after applying it to BASE at idx 5 from a non-member origin)
CASES: list[tuple[str, Event, Callable[[], State]]] = [
    ("join-new", NodeJoined(event_id="e", node_id="n3", node_name="three", version="2"),
     lambda: _expect(nodes={**BASE.nodes, "n3": NodeInfo(node_id="n3", node_name="three", version="2")})),
    ("join-again-keeps-last-seen", NodeJoined(event_id="e", node_id="n1", node_name="uno", version="2", api_endpoint="http://h"),
     lambda: _expect(nodes={**BASE.nodes, "n1": NodeInfo(node_id="n1", node_name="uno", version="2", api_endpoint="http://h", last_seen=T0)})),
    ("left", NodeLeft(event_id="e", node_id="n2"),
     lambda: _expect(nodes=_without(BASE.nodes, "n2"), edges=[], node_network=_without(BASE.node_network, "n2"),
                     downloads=_without(BASE.downloads, "n2"))),
    ("timed-out", NodeTimedOut(event_id="e", node_id="n1", last_event_age_s=40, heartbeat_age_s=31, effective_age_s=31, timeout_s=30),
     lambda: _expect(nodes=_without(BASE.nodes, "n1"), edges=[E2G], node_network=_without(BASE.node_network, "n1"),
                     downloads=_without(BASE.downloads, "n1"))),
    ("network", NodeNetworkUpdated(event_id="e", node_id="n1", interfaces=[]),
     lambda: _expect(node_network={**BASE.node_network, "n1": []})),
    ("edge-created-phantom", TopologyEdgeCreated(event_id="e", edge=Edge(source="a", sink="n1", kind="session")),
     lambda: _expect(edges=[Edge(source="a", sink="n1", kind="session"), *BASE.edges])),
    ("edge-created-twice", TopologyEdgeCreated(event_id="e", edge=E12), lambda: _expect()),
    ("edge-deleted", TopologyEdgeDeleted(event_id="e", edge=E21), lambda: _expect(edges=[E12, E2G])),
    ("instance-created", InstanceCreated(event_id="e", instance=I2), lambda: _expect(instances={"i1": I1, "i2": I2})),
    ("instance-created-duplicate", InstanceCreated(event_id="e", instance=_instance("i1", ["n9"], ["r9"])), lambda: _expect()),
    ("instance-deleted", InstanceDeleted(event_id="e", instance_id="i1", reason="operator"),
     lambda: _expect(instances={}, runners={})),
    ("placement-refused", InstancePlacementRefused(event_id="e", instance_id="i1", node_id="n2", needed_bytes=9, available_bytes=1, message="m"),
     lambda: _expect()),
    ("repair-abandoned", InstanceRepairAbandoned(event_id="e", model_id=M, instance_id="i1", node_id="n2", repair_hop=2,
                                                 reason="refused at the last hop"),
     lambda: _expect(repair_failures={M: RepairFailure(instance_id="i1", node_id="n2", repair_hop=2,
                                                       reason="refused at the last hop")})),
    ("runner-status", RunnerStatusUpdated(event_id="e", runner_id="r2", status=RunnerStatus(state="Failed", error_message="oom")),
     lambda: _expect(runners={**BASE.runners, "r2": RunnerStatus(state="Failed", error_message="oom")})),
    ("runner-deleted", RunnerDeleted(event_id="e", runner_id="r1"), lambda: _expect(runners={"r2": BASE.runners["r2"]})),
    ("task-created", TaskCreated(event_id="e", task=NEW_TASK), lambda: _expect(tasks={**BASE.tasks, "t9": NEW_TASK})),
    ("task-created-duplicate", TaskCreated(event_id="e", task=_task(PENDING, status="Running")), lambda: _expect()),
    ("task-acknowledged", TaskAcknowledged(event_id="e", task_id="t1"),
     lambda: _expect(tasks={**BASE.tasks, "t1": _task(PENDING, status="Running")})),
    ("task-acknowledged-late", TaskAcknowledged(event_id="e", task_id="t2"), lambda: _expect()),
    ("task-status", TaskStatusUpdated(event_id="e", task_id="t1", status="Cancelled", error_message="operator"),
     lambda: _expect(tasks={**BASE.tasks, "t1": _task(PENDING, status="Cancelled", error_message="operator")})),
    ("task-status-terminal-is-sticky", TaskStatusUpdated(event_id="e", task_id="t2", status="Running"), lambda: _expect()),
    ("task-failed", TaskFailed(event_id="e", task_id="t1", error_type="NodeLost", error_message="n2 timed out"),
     lambda: _expect(tasks={**BASE.tasks, "t1": _task(PENDING, status="Failed", error_type="NodeLost", error_message="n2 timed out")})),
    ("task-failed-after-complete", TaskFailed(event_id="e", task_id="t2", error_type="x", error_message="y"), lambda: _expect()),
    ("task-deleted", TaskDeleted(event_id="e", task_id="t2"), lambda: _expect(tasks={"t1": PENDING})),
    ("download-pending", DownloadPending(event_id="e", node_id="n2", model_id="other", attempt_id="a4"),
     lambda: _expect(downloads={**BASE.downloads, "n2": {**BASE.downloads["n2"], "other": DownloadStatusPending(attempt_id="a4")}})),
    ("download-ongoing-is-telemetry", DownloadOngoing(event_id="e", node_id="n1", model_id="x", attempt_id="a", downloaded_bytes=1, total_bytes=2),
     lambda: _expect()),
    ("download-completed", DownloadCompleted(event_id="e", node_id="n1", model_id="new", attempt_id="a5", total_bytes=7),
     lambda: _expect(downloads={**BASE.downloads, "n1": {**BASE.downloads["n1"], "new": DownloadStatusCompleted(attempt_id="a5", total_bytes=7)}})),
    ("download-failed", DownloadFailed(event_id="e", node_id="n1", model_id=M, attempt_id="a6", error_message="hub 500"),
     lambda: _expect(downloads={**BASE.downloads, "n1": {M: DownloadStatusFailed(attempt_id="a6", error_message="hub 500")}})),
    ("tracing", TracingStateChanged(event_id="e", enabled=True), lambda: _expect(tracing_enabled=True)),
    ("evicted-on-one-node", StagedModelEvicted(event_id="e", model_id=M, node_ids=["n2"]),
     lambda: _expect(downloads={**BASE.downloads, "n2": {"other": BASE.downloads["n2"]["other"]}})),
    ("evicted-everywhere", StagedModelEvicted(event_id="e", model_id=M),
     lambda: _expect(downloads={"n2": {"other": BASE.downloads["n2"]["other"]}})),
    ("evicted-keeps-failed-records", StagedModelEvicted(event_id="e", model_id="other"), lambda: _expect()),
    ("custom-card-added", CustomModelCardAdded(event_id="e", card=CARD),
     lambda: _expect(custom_cards={CARD.model_id: CARD})),
    ("custom-card-deleted-unknown", CustomModelCardDeleted(event_id="e", model_id=CARD.model_id), lambda: _expect()),
]


def test_custom_card_added_then_deleted() -> None:
    added = apply(BASE, _at(CustomModelCardAdded(event_id="e", card=CARD)))
    deleted = apply(added, _at(CustomModelCardDeleted(event_id="f", model_id=CARD.model_id), idx=added.last_event_applied_idx + 1))
    assert added.custom_cards == {CARD.model_id: CARD}
    assert deleted.custom_cards == {}


def test_a_new_placement_of_the_model_clears_its_repair_failure() -> None:
    failure = RepairFailure(instance_id="i0", node_id="n2", repair_hop=2, reason="gave up")
    before = BASE.model_copy(update={"repair_failures": {I2.model_id: failure, "other/model": failure}})
    after = apply(before, _at(InstanceCreated(event_id="e", instance=I2)))
    assert after.repair_failures == {"other/model": failure}


def test_every_event_type_has_a_case() -> None:
    assert {type(event) for _, event, _ in CASES} == set(EVENT_TYPES)


@pytest.mark.parametrize(("event", "expected"), [pytest.param(e, x, id=n) for n, e, x in CASES])
def test_event_effect(event: Event, expected: Callable[[], State]) -> None:
    before_bytes = canonical_bytes(BASE)
    before_copy = copy.deepcopy(BASE)
    after = apply(BASE, _at(event))
    assert after == expected()
    assert canonical_bytes(after) == canonical_bytes(expected())
    # The input is never mutated.
    assert canonical_bytes(BASE) == before_bytes
    assert before_copy == BASE


# Events naming ids the state has never heard of: nothing changes but the index.
UNKNOWN: list[Event] = [
    NodeLeft(event_id="e", node_id="zz"),
    NodeTimedOut(event_id="e", node_id="zz", last_event_age_s=1, effective_age_s=1, timeout_s=1),
    NodeNetworkUpdated(event_id="e", node_id="zz", interfaces=LAN),
    TopologyEdgeDeleted(event_id="e", edge=Edge(source="zz", sink="n1", kind="session")),
    InstanceDeleted(event_id="e", instance_id="zz", reason="r"),
    InstancePlacementRefused(event_id="e", instance_id="zz", node_id="zz", needed_bytes=1, available_bytes=0, message="m"),
    RunnerStatusUpdated(event_id="e", runner_id="zz", status=RunnerStatus(state="Ready")),
    RunnerDeleted(event_id="e", runner_id="zz"),
    TaskAcknowledged(event_id="e", task_id="zz"),
    TaskStatusUpdated(event_id="e", task_id="zz", status="Complete"),
    TaskFailed(event_id="e", task_id="zz", error_type="x", error_message="y"),
    TaskDeleted(event_id="e", task_id="zz"),
    DownloadPending(event_id="e", node_id="zz", model_id=M, attempt_id="a"),
    DownloadOngoing(event_id="e", node_id="zz", model_id=M, attempt_id="a", downloaded_bytes=0, total_bytes=0),
    DownloadCompleted(event_id="e", node_id="zz", model_id=M, attempt_id="a", total_bytes=1),
    DownloadFailed(event_id="e", node_id="zz", model_id=M, attempt_id="a", error_message="x"),
    StagedModelEvicted(event_id="e", model_id="zz"),
    StagedModelEvicted(event_id="e", model_id=M, node_ids=["zz"]),
    CustomModelCardDeleted(event_id="e", model_id="local/zz"),
]


@pytest.mark.parametrize("event", [pytest.param(e, id=f"{type(e).__name__}-{i}") for i, e in enumerate(UNKNOWN)])
def test_unknown_ids_are_no_ops(event: Event) -> None:
    after = apply(BASE, _at(event))
    assert after == _expect()


def test_runner_status_for_deleted_instance_does_not_resurrect_it() -> None:
    gone = apply(BASE, _at(InstanceDeleted(event_id="e", instance_id="i1", reason="r")))
    late = apply(gone, _at(RunnerStatusUpdated(event_id="e", runner_id="r1", status=RunnerStatus(state="Shutdown")), idx=6))
    assert late.runners == {}


def test_download_outcome_for_pruned_node_is_dropped() -> None:
    gone = apply(BASE, _at(NodeLeft(event_id="e", node_id="n1")))
    late = apply(gone, _at(DownloadCompleted(event_id="e", node_id="n1", model_id=M, attempt_id="a", total_bytes=1), idx=6))
    assert "n1" not in late.downloads


def test_deleting_last_edge_removes_phantom_node() -> None:
    assert "ghost" in BASE.phantom_node_ids()
    after = apply(BASE, _at(TopologyEdgeDeleted(event_id="e", edge=E2G)))
    assert after.phantom_node_ids() == []
    assert after.graph_node_ids() == ["n1", "n2"]


def test_node_removal_leaves_instances_for_the_master() -> None:
    after = apply(BASE, _at(NodeTimedOut(event_id="e", node_id="n2", last_event_age_s=40, effective_age_s=31, timeout_s=30)))
    assert after.instances == BASE.instances
    assert after.runners == BASE.runners


@pytest.mark.parametrize(
    ("origin", "expected_last_seen"),
    [("n2", T0 + timedelta(seconds=9)), ("n1", T0 + timedelta(seconds=9))],
)
def test_member_origin_bumps_last_seen(origin: str, expected_last_seen: datetime) -> None:
    after = apply(BASE, _at(TracingStateChanged(event_id="e", enabled=False), origin=origin, at=T0 + timedelta(seconds=9)))
    assert after.nodes[origin].last_seen == expected_last_seen
    others = {k: v for k, v in after.nodes.items() if k != origin}
    assert others == {k: v for k, v in BASE.nodes.items() if k != origin}


def test_joining_node_is_seen_by_its_own_join() -> None:
    at = T0 + timedelta(seconds=1)
    after = apply(BASE, _at(NodeJoined(event_id="e", node_id="n3", node_name="x", version="1"), origin="n3", at=at))
    assert after.nodes["n3"].last_seen == at


def test_leaving_node_is_not_resurrected_by_its_origin_bump() -> None:
    after = apply(BASE, _at(NodeLeft(event_id="e", node_id="n1"), origin="n1"))
    assert "n1" not in after.nodes


@pytest.mark.parametrize("idx", [0, 4, 6, 100])
def test_out_of_order_index_rejected_and_input_untouched(idx: int) -> None:
    before = canonical_bytes(BASE)
    with pytest.raises(EventOutOfOrder) as info:
        apply(BASE, _at(TracingStateChanged(event_id="e", enabled=True), idx=idx))
    assert (info.value.expected, info.value.got) == (5, idx)
    assert canonical_bytes(BASE) == before


def test_apply_all_and_hash() -> None:
    events = [
        _at(NodeJoined(event_id="a", node_id="n1", node_name="one", version="1"), idx=0, origin="n1"),
        _at(TopologyEdgeCreated(event_id="b", edge=E12), idx=1, origin="n1"),
        _at(TracingStateChanged(event_id="c", enabled=True), idx=2),
    ]
    state = apply_all(State(), events)
    assert state.last_event_applied_idx == 2
    assert state.tracing_enabled and state.edges == [E12]
    assert state_hash(state) == state_hash(State.model_validate(state.to_wire()))
    assert state_hash(state) != state_hash(State())
    assert len(state_hash(state)) == 64
    with pytest.raises(EventOutOfOrder):
        apply_all(State(), events[1:])
