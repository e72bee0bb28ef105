"""The master's reconciliation pass, rule by rule, and the order its decisions come out in."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from skulk.master.plan import (
    HEARTBEAT_WARN_S,
    NODE_TIMEOUT_S,
    ZOMBIE_TASK_GRACE_S,
    MasterView,
    delete_instances_on_departed_nodes,
    heartbeat_warnings,
    plan,
    reap_zombie_tasks,
    time_out_silent_nodes,
    track_zombies,
)
from skulk.shared.apply import apply_all
from skulk.shared.telemetry_view import NodeFreshness
from skulk.shared.types.common import TERMINAL_TASK_STATUSES
from skulk.shared.types.events import (
    Event,
    IndexedEvent,
    InstanceDeleted,
    InstanceRepairAbandoned,
    NodeTimedOut,
    TaskFailed,
)
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.state import NodeInfo, State
from skulk.shared.types.tasks import (
    EmbeddingParams,
    TextGeneration,
    TextGenerationParams,
    WorkloadTask,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
ME = "master"


def _instance(instance_id: str, nodes: list[str]) -> Instance:
    n = len(nodes)
    return Instance(
        instance_id=instance_id, model_id="m", sharding="Pipeline", context_token_limit=4096,
        shards=[ShardAssignment(node_id=node, runner_id=f"{instance_id}-r{i}", rank=i, world_size=n,
                                start_layer=i, end_layer=i + 1, backend="cpu")
                for i, node in enumerate(nodes)],
    )


def _gen(task_id: str, instance_id: str, status: str = "Running") -> TextGeneration:
    return TextGeneration(owner_node_id="n1", task_id=task_id, instance_id=instance_id, status=status, command_id=f"c-{task_id}",
                          params=TextGenerationParams(model_id="m", prompt="hi"))


def _emb(task_id: str, instance_id: str, status: str = "Pending") -> WorkloadTask:
    return WorkloadTask(owner_node_id="n1", task_id=task_id, instance_id=instance_id, status=status, command_id=f"c-{task_id}",
                     params=EmbeddingParams(model_id="m", inputs=["x"]))


def _life(task_id: str, instance_id: str, status: str = "Running") -> WorkloadTask:
    return _emb(task_id, instance_id, status)


def _node(node_id: str) -> NodeInfo:
    return NodeInfo(node_id=node_id, node_name=node_id, version="1", last_seen=T0)


STATE = State(
    nodes={n: _node(n) for n in (ME, "a", "b", "c")},
    instances={
        "ia": _instance("ia", ["a"]),           # only on a
        "iab": _instance("iab", ["b", "a"]),    # spans a and b
        "ic": _instance("ic", ["c", ME]),       # c and the master
    },
    tasks={
        "t1": _gen("t1", "ia"),
        "t2": _emb("t2", "iab"),
        "t3": _life("t3", "ia"),
        "t4": _gen("t4", "ia", status="Complete"),
        "t5": _gen("t5", "ic"),
        "t6": _gen("t6", "iab", status="Cancelled"),
    },
    last_event_applied_idx=10,
)

FRESH = NodeFreshness(heartbeat_age_s=1.0, telemetry_age_s=3.0, last_event_age_s=50.0)
DEAD = NodeFreshness(heartbeat_age_s=31.0, telemetry_age_s=40.0, last_event_age_s=90.0)
ALIVE_BY_FALLBACK = NodeFreshness(heartbeat_age_s=45.0, telemetry_age_s=2.0, last_event_age_s=90.0)
JUST_JOINED = NodeFreshness(last_event_age_s=4.0)
SILENT_SINCE_JOIN = NodeFreshness(last_event_age_s=NODE_TIMEOUT_S)
NOTHING = NodeFreshness()


def _ids() -> itertools.count:
    return itertools.count()


def _new_id(counter: itertools.count | None = None):  # type: ignore[no-untyped-def]
    counter = counter or _ids()
    return lambda: f"ev{next(counter)}"


def _view(
    state: State = STATE, now: float = 100.0, zombie_since: dict | None = None, **fresh: NodeFreshness | None
) -> MasterView:
    freshness = {n: FRESH for n in state.nodes} | fresh
    freshness = {n: f for n, f in freshness.items() if f is not None}
    return MasterView(state=state, me=ME, freshness=freshness, zombie_since=zombie_since or {}, now=now)


def _shape(events: list[Event]) -> list[tuple[str, str]]:
    """(type, subject) of each event: the order is the point."""
    out = []
    for e in events:
        if isinstance(e, TaskFailed):
            out.append(("TaskFailed", e.task_id))
        elif isinstance(e, InstanceDeleted):
            out.append(("InstanceDeleted", e.instance_id))
        elif isinstance(e, NodeTimedOut):
            out.append(("NodeTimedOut", e.node_id))
        elif isinstance(e, InstanceRepairAbandoned):
            out.append(("Abandoned", e.instance_id))  # model "m" has no card: no re-placement
        else:
            out.append((type(e).__name__, ""))
    return out


def _apply(state: State, events: list[Event]) -> State:
    start = state.last_event_applied_idx + 1
    indexed = [IndexedEvent(idx=start + i, origin=ME, indexed_at=T0, event=e) for i, e in enumerate(events)]
    return apply_all(state, indexed)


# -- rule: time out silent nodes -----------------------------------------------------------

TIMEOUT_CASES = [
    ("all-alive", {}, []),
    ("dead-node-tasks-then-instances-then-node", {"a": DEAD}, [
        ("TaskFailed", "t1"), ("TaskFailed", "t2"), ("TaskFailed", "t3"),
        ("InstanceDeleted", "ia"), ("InstanceDeleted", "iab"), ("NodeTimedOut", "a"),
        ("Abandoned", "ia"), ("Abandoned", "iab")]),
    ("shared-instance-torn-down-once", {"a": DEAD, "b": DEAD}, [
        ("TaskFailed", "t1"), ("TaskFailed", "t2"), ("TaskFailed", "t3"),
        ("InstanceDeleted", "ia"), ("InstanceDeleted", "iab"), ("NodeTimedOut", "a"), ("NodeTimedOut", "b"),
        ("Abandoned", "ia"), ("Abandoned", "iab")]),
    ("dead-node-without-instances", {"b": DEAD, "a": FRESH}, [
        ("TaskFailed", "t2"), ("InstanceDeleted", "iab"), ("NodeTimedOut", "b"), ("Abandoned", "iab")]),
    ("master-never-times-itself-out", {ME: DEAD}, []),
    ("fallback-telemetry-keeps-node", {"a": ALIVE_BY_FALLBACK}, []),
    ("just-joined-judged-by-last-event", {"a": JUST_JOINED}, []),
    ("last-event-age-alone-can-prune", {"c": SILENT_SINCE_JOIN}, [
        ("TaskFailed", "t5"), ("InstanceDeleted", "ic"), ("NodeTimedOut", "c"), ("Abandoned", "ic")]),
    ("nothing-known-left-alone", {"a": NOTHING}, []),
    ("missing-from-freshness-left-alone", {"a": None}, []),
    ("just-under-timeout", {"a": NodeFreshness(heartbeat_age_s=NODE_TIMEOUT_S - 0.01)}, []),
]


@pytest.mark.parametrize(("name", "fresh", "expected"), TIMEOUT_CASES, ids=[c[0] for c in TIMEOUT_CASES])
def test_time_out_silent_nodes(name: str, fresh: dict, expected: list) -> None:
    events = time_out_silent_nodes(_view(**fresh), _new_id()) or []
    assert _shape(events) == expected


def test_node_timed_out_persists_the_deciding_ages() -> None:
    events = time_out_silent_nodes(_view(a=DEAD), _new_id()) or []
    timed_out = next(e for e in events if isinstance(e, NodeTimedOut))
    assert timed_out == NodeTimedOut(event_id=timed_out.event_id, node_id="a", last_event_age_s=90.0,
                                      heartbeat_age_s=31.0, telemetry_age_s=40.0, effective_age_s=31.0,
                                      timeout_s=NODE_TIMEOUT_S)


def test_node_lost_failures_name_the_node_and_age() -> None:
    events = time_out_silent_nodes(_view(a=DEAD), _new_id()) or []
    failures = [e for e in events if isinstance(e, TaskFailed)]
    assert failures and all(f.error_type == "NodeLost" for f in failures)
    assert all("node a" in f.error_message and "31.0s" in f.error_message for f in failures)
    deletions = [e for e in events if isinstance(e, InstanceDeleted)]
    assert all("node a" in d.reason for d in deletions)


def test_member_that_never_logged_is_recorded_with_its_effective_age() -> None:
    state = STATE.model_copy(update={"nodes": {**STATE.nodes, "a": NodeInfo(node_id="a", node_name="a", version="1")}})
    events = time_out_silent_nodes(_view(state, a=NodeFreshness(heartbeat_age_s=33.0)), _new_id()) or []
    timed_out = next(e for e in events if isinstance(e, NodeTimedOut))
    assert timed_out.last_event_age_s == 33.0 and timed_out.effective_age_s == 33.0


def test_event_ids_come_from_the_injected_factory_and_are_unique() -> None:
    events = time_out_silent_nodes(_view(a=DEAD, b=DEAD), _new_id()) or []
    assert [e.event_id for e in events] == [f"ev{i}" for i in range(len(events))]


# -- rule: instances on departed nodes -------------------------------------------------------

DEPARTED_CASES = [
    ("all-members", [], []),
    ("left-node", ["a"], [("TaskFailed", "t1"), ("TaskFailed", "t2"), ("TaskFailed", "t3"),
                          ("InstanceDeleted", "ia"), ("InstanceDeleted", "iab"),
                          ("Abandoned", "ia"), ("Abandoned", "iab")]),
    ("other-rank-gone", ["b"], [("TaskFailed", "t2"), ("InstanceDeleted", "iab"), ("Abandoned", "iab")]),
]


@pytest.mark.parametrize(("name", "gone", "expected"), DEPARTED_CASES, ids=[c[0] for c in DEPARTED_CASES])
def test_delete_instances_on_departed_nodes(name: str, gone: list[str], expected: list) -> None:
    state = STATE.model_copy(update={"nodes": {n: i for n, i in STATE.nodes.items() if n not in gone}})
    events = delete_instances_on_departed_nodes(_view(state), _new_id()) or []
    assert _shape(events) == expected
    assert all(f.error_type == "NodeLost" for f in events if isinstance(f, TaskFailed))


# -- rule: zombie tasks ---------------------------------------------------------------------

ZSTATE = STATE.model_copy(update={"tasks": {
    **STATE.tasks,
    "z1": _life("z1", "gone"),
    "z2": _gen("z2", "gone", status="Pending"),
    "z3": _gen("z3", "gone", status="Failed"),
}})

ZOMBIE_CASES = [
    ("untracked-not-judged", {}, []),
    ("within-grace", {"z1": 100.0 - ZOMBIE_TASK_GRACE_S + 0.1}, []),
    ("past-grace", {"z1": 100.0 - ZOMBIE_TASK_GRACE_S, "z2": 50.0}, ["z1", "z2"]),
    ("terminal-never-reaped", {"z3": 0.0}, []),
    ("live-instance-never-reaped", {"t1": 0.0}, []),
]


@pytest.mark.parametrize(("name", "since", "expected"), ZOMBIE_CASES, ids=[c[0] for c in ZOMBIE_CASES])
def test_reap_zombie_tasks(name: str, since: dict, expected: list[str]) -> None:
    events = reap_zombie_tasks(_view(ZSTATE, now=100.0, zombie_since=since), _new_id()) or []
    assert [e.task_id for e in events] == expected
    assert all(e.error_type == "InstanceGone" and "instance gone" in e.error_message for e in events)


TRACK_CASES = [
    ("new-zombies-start-now", {}, {"z1": 7.0, "z2": 7.0}),
    ("first-seen-kept", {"z1": 2.0}, {"z1": 2.0, "z2": 7.0}),
    ("finished-or-vanished-dropped", {"z3": 1.0, "old": 1.0, "t1": 1.0}, {"z1": 7.0, "z2": 7.0}),
]


@pytest.mark.parametrize(("name", "previous", "expected"), TRACK_CASES, ids=[c[0] for c in TRACK_CASES])
def test_track_zombies(name: str, previous: dict, expected: dict) -> None:
    assert track_zombies(ZSTATE, previous, 7.0) == expected


# -- the chain ------------------------------------------------------------------------------

def test_plan_takes_the_most_urgent_rule_first() -> None:
    state = ZSTATE.model_copy(update={"nodes": {n: i for n, i in ZSTATE.nodes.items() if n != "c"}})
    view = _view(state, now=100.0, zombie_since={"z1": 0.0}, a=DEAD)
    first = plan(view, _new_id())
    assert {s[0] for s in _shape(first)} == {"TaskFailed", "InstanceDeleted", "NodeTimedOut", "Abandoned"}
    # once applied, the next pass handles the instance on the departed node c ...
    state = _apply(state, first)
    second = plan(_view(state, now=100.0, zombie_since=track_zombies(state, {"z1": 0.0}, 100.0)), _new_id())
    assert _shape(second) == [("TaskFailed", "t5"), ("InstanceDeleted", "ic"), ("Abandoned", "ic")]
    # ... then the zombies past their grace, then nothing.
    state = _apply(state, second)
    since = track_zombies(state, {"z1": 0.0, "z2": 0.0}, 100.0)
    third = plan(_view(state, now=100.0, zombie_since=since), _new_id())
    assert _shape(third) == [("TaskFailed", "z1"), ("TaskFailed", "z2")]
    state = _apply(state, third)
    assert plan(_view(state, now=100.0, zombie_since=track_zombies(state, since, 100.0)), _new_id()) == []


@pytest.mark.parametrize(
    "fresh",
    [{"a": DEAD}, {"a": DEAD, "b": DEAD, "c": DEAD}, {"c": SILENT_SINCE_JOIN}],
    ids=["one", "all-but-master", "by-last-event"],
)
def test_applied_plan_leaves_no_open_task_on_a_deleted_instance(fresh: dict) -> None:
    events = plan(_view(**fresh), _new_id())
    after = _apply(STATE, events)
    for task in after.tasks.values():
        if task.instance_id not in after.instances:
            assert task.status in TERMINAL_TASK_STATUSES, task.task_id
    assert all(n not in after.nodes for n in fresh)
    # every failure indexes ahead of the deletion of its instance
    shape = _shape(events)
    for i, (kind, subject) in enumerate(shape):
        if kind == "TaskFailed":
            inst = STATE.tasks[subject].instance_id
            assert ("InstanceDeleted", inst) not in shape[:i]


def test_planning_is_a_pure_function_of_the_view() -> None:
    view = _view(a=DEAD)
    assert plan(view, _new_id()) == plan(view, _new_id())
    assert view.state == STATE


# -- heartbeat warnings ---------------------------------------------------------------------

HB_CASES = [
    ("on-time", {"a": 2.0}, set(), set(), set()),
    ("late-warns-once", {"a": HEARTBEAT_WARN_S}, set(), {"a"}, set()),
    ("already-warned-not-again", {"a": 25.0}, {"a"}, set(), set()),
    ("recovered", {"a": 1.0}, {"a"}, set(), {"a"}),
    ("no-heartbeat-is-neither", {"a": None}, {"a"}, set(), set()),
    ("gone-is-not-recovery", {}, {"a"}, set(), set()),
    ("mixed", {"a": 12.0, "b": 3.0, "c": 9.99}, {"b"}, {"a"}, {"b"}),
]


@pytest.mark.parametrize(("name", "ages", "warned", "late", "recovered"), HB_CASES, ids=[c[0] for c in HB_CASES])
def test_heartbeat_warnings(name: str, ages: dict, warned: set, late: set, recovered: set) -> None:
    freshness = {n: NodeFreshness(heartbeat_age_s=a, last_event_age_s=1.0) for n, a in ages.items()}
    assert heartbeat_warnings(freshness, frozenset(warned)) == (frozenset(late), frozenset(recovered))


def test_a_lower_node_timeout_prunes_sooner_and_is_recorded() -> None:
    quiet = NodeFreshness(heartbeat_age_s=8.0, telemetry_age_s=8.0, last_event_age_s=8.0)
    assert time_out_silent_nodes(_view(b=quiet), _new_id()) is None  # default: 30 s
    view = MasterView(state=STATE, me=ME, freshness={n: FRESH for n in STATE.nodes} | {"b": quiet},
                      node_timeout_s=6.0)
    events = time_out_silent_nodes(view, _new_id()) or []
    timed_out = next(e for e in events if isinstance(e, NodeTimedOut))
    assert timed_out.node_id == "b" and timed_out.timeout_s == 6.0


# -- presence loss: the fast path ------------------------------------------------------------


def _presence_view(lost: dict[str, float], **fresh: NodeFreshness | None) -> MasterView:
    base = _view(**fresh)
    return MasterView(state=base.state, me=ME, freshness=base.freshness, now=base.now, presence_lost=lost)


@pytest.mark.parametrize(
    ("lost", "expected"),
    [
        ({}, None),
        ({ME: 3.0}, None),  # the master never judges itself
        ({"ghost": 3.0}, None),  # not a member: nothing to prune
        ({"a": 0.6}, [("TaskFailed", "t1"), ("TaskFailed", "t2"), ("TaskFailed", "t3"),
                      ("InstanceDeleted", "ia"), ("InstanceDeleted", "iab"), ("NodeTimedOut", "a"),
                      ("Abandoned", "ia"), ("Abandoned", "iab")]),
        ({"c": 1.0}, [("TaskFailed", "t5"), ("InstanceDeleted", "ic"), ("NodeTimedOut", "c"),
                      ("Abandoned", "ic")]),
    ],
)
def test_presence_loss_prunes_at_once_and_fails_the_nodes_streams_first(
    lost: dict[str, float], expected: list[tuple[str, str]] | None
) -> None:
    events = plan(_presence_view(lost), _new_id())
    assert (_shape(events) or None) == expected


def test_presence_loss_names_the_node_and_its_cause_while_it_still_heartbeats() -> None:
    # Fresh telemetry (the last heartbeat a second ago) never outvotes a withdrawn presence.
    events = plan(_presence_view({"a": 0.7}, a=FRESH), _new_id())
    pruned = next(e for e in events if isinstance(e, NodeTimedOut))
    assert (pruned.node_id, pruned.cause, pruned.effective_age_s) == ("a", "presence_lost", 0.7)
    failures = [e for e in events if isinstance(e, TaskFailed)]
    assert failures and all("node a" in f.error_message and "presence" in f.error_message for f in failures)


def test_silence_timeout_is_still_the_backstop_without_presence_verdicts() -> None:
    events = plan(_view(a=DEAD), _new_id())
    pruned = next(e for e in events if isinstance(e, NodeTimedOut))
    assert (pruned.node_id, pruned.cause) == ("a", "silence")
