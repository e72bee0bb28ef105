"""Replication properties of the reducer over generated event histories.

Ids come from small pools so that generated events collide with each other (joins then
leaves, statuses for deleted runners, evictions of live downloads) instead of all being
unknown-id no-ops.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skulk.shared.apply import apply, apply_all, state_hash
from skulk.shared.codec import canonical_bytes, pack, unpack
from skulk.shared.types.common import Edge, NetworkInterface, canonical_edges
from skulk.shared.types.events import (
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
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
from skulk.shared.types.state import State
from skulk.shared.types.tasks import (
    EmbeddingParams,
    TextGeneration,
    TextGenerationParams,
    WorkloadTask,
)

PROPERTY_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

NODES = ["n0", "n1", "n2"]
GRAPH_NODES = [*NODES, "ghost"]
INSTANCES = ["i0", "i1"]
RUNNERS = ["i0-r0", "i0-r1", "i1-r0", "i1-r1", "zz"]
TASKS = ["t0", "t1", "t2"]
MODELS = ["m0", "m1"]
RUNNER_STATES = ["Idle", "Connecting", "Loading", "Ready", "Running", "Shutdown", "Failed"]
TASK_STATUSES = ["Pending", "Running", "Complete", "Failed", "Cancelled"]

node = st.sampled_from(NODES)
model = st.sampled_from(MODELS)
task_id = st.sampled_from(TASKS)
# Sampled rather than st.text(): generation dominates the run time, and what matters here
# is that non-ASCII survives every encoding, not the space of strings.
text = st.sampled_from(["", "a", "Ünïcødé ✓", "line\nbreak", "😀"])
event_id = st.sampled_from(["e0", "e1", "e2", "e3"])
attempt = st.sampled_from(["a0", "a1", "a2"])
size = st.integers(min_value=0, max_value=2**40)
age = st.floats(min_value=0, max_value=1e6, allow_nan=False)
moment = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30))]),
)


@st.composite
def edges(draw: st.DrawFn) -> Edge:
    source, sink = draw(st.lists(st.sampled_from(GRAPH_NODES), min_size=2, max_size=2, unique=True))
    kind = draw(st.sampled_from(["session", "probed"]))
    address = draw(st.sampled_from([None, "10.0.0.1:1"]))
    return Edge(source=source, sink=sink, kind=kind, address=address)


@st.composite
def instances(draw: st.DrawFn) -> Instance:
    iid = draw(st.sampled_from(INSTANCES))
    hosts = draw(st.lists(node, min_size=1, max_size=2))
    n = len(hosts)
    return Instance(
        instance_id=iid,
        model_id=draw(model),
        sharding=draw(st.sampled_from(["Pipeline", "Tensor"])),
        shards=[
            ShardAssignment(
                node_id=h, runner_id=f"{iid}-r{rank}", rank=rank, world_size=n,
                start_layer=rank * 8, end_layer=rank * 8 + 8, backend="llama_cpp-cpu",
            )
            for rank, h in enumerate(hosts)
        ],
        excluded_nodes=draw(st.lists(node, max_size=1)),
        context_token_limit=draw(st.integers(1, 1 << 20)),
        repair_hop=draw(st.integers(0, 2)),
    )


@st.composite
def tasks(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    common = {
        "task_id": draw(task_id),
        "instance_id": draw(st.sampled_from(INSTANCES)),
        "status": draw(st.sampled_from(TASK_STATUSES)),
    }
    kind = draw(st.sampled_from(["text", "embed"]))
    if kind == "text":
        params = TextGenerationParams(
            model_id=draw(model),
            prompt=draw(text),
            temperature=draw(st.none() | st.floats(0, 2, allow_nan=False)),
            stop=draw(st.lists(text, max_size=2)),
        )
        return TextGeneration(owner_node_id="n1", command_id=draw(event_id), params=params, **common)
    params = EmbeddingParams(model_id=draw(model), inputs=draw(st.lists(text, min_size=1, max_size=2)))
    return WorkloadTask(owner_node_id="n1", command_id=draw(event_id), params=params, **common)


def _model(cls, **fields):  # type: ignore[no-untyped-def]
    # Not st.builds: it reads pydantic's alias-based signature and would also pass the
    # camelCase names, which `extra="forbid"` rejects alongside the snake_case ones.
    return st.fixed_dictionaries(fields).map(lambda kwargs: cls(**kwargs))


def _ev(cls, **fields):  # type: ignore[no-untyped-def]
    return _model(cls, event_id=event_id, **fields)


runner_status = _model(
    RunnerStatus, state=st.sampled_from(RUNNER_STATES), error_message=st.none() | text
)

any_event = st.one_of(
    _ev(NodeJoined, node_id=node, node_name=text, version=st.sampled_from(["1", "2"]),
        api_endpoint=st.none() | st.just("http://h:52415")),
    _ev(NodeLeft, node_id=node),
    _ev(NodeTimedOut, node_id=node, last_event_age_s=age, heartbeat_age_s=st.none() | age,
        telemetry_age_s=st.none() | age, effective_age_s=age, timeout_s=age),
    _ev(NodeNetworkUpdated, node_id=node, interfaces=st.lists(
        _model(NetworkInterface, name=text, addresses=st.lists(text, max_size=2),
                  kind=st.sampled_from(["ethernet", "wifi", "overlay"])), max_size=2)),
    _ev(TopologyEdgeCreated, edge=edges()),
    _ev(TopologyEdgeDeleted, edge=edges()),
    _ev(InstanceCreated, instance=instances()),
    _ev(InstanceDeleted, instance_id=st.sampled_from(INSTANCES), reason=text),
    _ev(InstancePlacementRefused, instance_id=st.sampled_from(INSTANCES), node_id=node,
        needed_bytes=size, available_bytes=size, message=text),
    _ev(InstanceRepairAbandoned, model_id=model, instance_id=st.sampled_from(INSTANCES), node_id=st.none() | node,
        repair_hop=st.integers(0, 2), reason=text),
    _ev(RunnerStatusUpdated, runner_id=st.sampled_from(RUNNERS), status=runner_status),
    _ev(RunnerDeleted, runner_id=st.sampled_from(RUNNERS)),
    _ev(TaskCreated, task=tasks()),
    _ev(TaskAcknowledged, task_id=task_id),
    _ev(TaskStatusUpdated, task_id=task_id, status=st.sampled_from(TASK_STATUSES),
        error_message=st.none() | text),
    _ev(TaskFailed, task_id=task_id, error_type=text, error_message=text),
    _ev(TaskDeleted, task_id=task_id),
    _ev(DownloadPending, node_id=node, model_id=model, attempt_id=attempt),
    _ev(DownloadOngoing, node_id=node, model_id=model, attempt_id=attempt,
        downloaded_bytes=size, total_bytes=size),
    _ev(DownloadCompleted, node_id=node, model_id=model, attempt_id=attempt, total_bytes=size),
    _ev(DownloadFailed, node_id=node, model_id=model, attempt_id=attempt, error_message=text),
    _ev(TracingStateChanged, enabled=st.booleans()),
    _ev(StagedModelEvicted, model_id=model, node_ids=st.none() | st.lists(node, max_size=2)),
)


@st.composite
def histories(draw: st.DrawFn) -> list[IndexedEvent]:
    # A prelude of creations in dependency order, so most histories have members,
    # instances, runners, tasks and downloads for the rest to update, delete or race.
    prelude = [
        *draw(st.lists(_ev(NodeJoined, node_id=node, node_name=text, version=st.just("1")), max_size=3)),
        *draw(st.lists(_ev(TopologyEdgeCreated, edge=edges()), max_size=4)),
        *draw(st.lists(_ev(InstanceCreated, instance=instances()), max_size=2)),
        *draw(st.lists(_ev(RunnerStatusUpdated, runner_id=st.sampled_from(RUNNERS), status=runner_status), max_size=3)),
        *draw(st.lists(_ev(TaskCreated, task=tasks()), max_size=2)),
        *draw(st.lists(_ev(DownloadCompleted, node_id=node, model_id=model, attempt_id=attempt, total_bytes=size), max_size=2)),
    ]
    events = [*prelude, *draw(st.lists(any_event, max_size=40))]
    return [
        IndexedEvent(
            idx=i,
            origin=draw(st.sampled_from([*NODES, "master"])),
            indexed_at=draw(moment),
            event=event,
        )
        for i, event in enumerate(events)
    ]


def _as_received(history: list[IndexedEvent]) -> list[IndexedEvent]:
    """What a follower decodes off the wire."""
    return [unpack(IndexedEvent, pack(e)) for e in history]


def _assert_invariants(state: State) -> None:
    assert state.edges == canonical_edges(state.edges)
    assert set(state.runners) <= state.runner_ids()
    assert set(state.downloads) <= set(state.nodes)
    assert set(state.node_network) <= set(state.nodes)
    assert all(state.downloads.values()), "no empty per-node download maps"


@PROPERTY_SETTINGS
@given(histories())
def test_leader_and_follower_agree_byte_for_byte(history: list[IndexedEvent]) -> None:
    leader = apply_all(State(), history)
    follower = apply_all(State(), _as_received(history))
    assert canonical_bytes(leader) == canonical_bytes(follower)
    assert state_hash(leader) == state_hash(follower)
    assert leader == follower
    assert leader.last_event_applied_idx == len(history) - 1
    _assert_invariants(leader)


@PROPERTY_SETTINGS
@given(histories())
def test_apply_never_mutates_its_input(history: list[IndexedEvent]) -> None:
    state = State()
    for indexed in history:
        before = canonical_bytes(state)
        event_before = canonical_bytes(indexed)
        after = apply(state, indexed)
        assert canonical_bytes(state) == before
        assert canonical_bytes(indexed) == event_before
        _assert_invariants(after)
        state = after


@PROPERTY_SETTINGS
@given(histories(), st.data())
def test_snapshot_then_tail_equals_full_replay(history: list[IndexedEvent], data: st.DataObject) -> None:
    k = data.draw(st.integers(min_value=0, max_value=len(history)), label="snapshot_at")
    full = apply_all(State(), history)
    snapshot = unpack(State, pack(apply_all(State(), history[:k])))
    resumed = apply_all(snapshot, _as_received(history)[k:])
    assert canonical_bytes(resumed) == canonical_bytes(full)
    assert state_hash(resumed) == state_hash(full)
