"""The master's reconciliation pass: which cleanup decisions the cluster needs right now.

`plan(view, new_id)` looks at replicated State plus the live freshness of every node and
returns the events the master should index next, as a chain of ordered rules where the
first rule with something to do wins (the chain is the list of priorities). The shell
indexes the result with `index_own` and applies it before planning again, so one pass's
decisions are never repeated by the next.

Order *within* a decision matters as much as the decision: every TaskFailed is emitted
before the InstanceDeleted that removes its instance, and both before the NodeTimedOut
that removes the node. Applied in that order, the owning API sees each open request fail
(and can end its stream with an error) before anything it refers to disappears, and no task
is ever left open on an instance that no longer exists.

An instance torn down because one of its nodes was lost is placed again on the surviving
members in the same pass (`skulk.master.repair.replace_after_node_loss`): its InstanceCreated
(or InstanceRepairAbandoned when nothing fits) comes after every TaskFailed, InstanceDeleted
and NodeTimedOut of the pass. Operator deletes never come through here, so they are never
re-placed. A not-yet-serving instance with a rank whose download failed terminally is torn
down and re-placed without that node (`skulk.master.repair`), after dead nodes are handled.
A multi-rank group that was serving and lost a rank while every node stays alive (a runner
crashed or was killed) is re-placed under a fresh id after BROKEN_GROUP_GRACE_S. An instance
with a runner its worker gave up on (the crash breaker) is re-placed away from that node, or
kept Failed with the reason recorded when nothing else admits it.

Pure: no clock, no I/O, ids come from the injected `new_id`. The master never judges itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NotRequired, TypedDict

from skulk.master.presence_loss import PRESENCE_LOSS_CONFIRM_S
from skulk.master.repair import (
    RepairInputs,
    broken_group_failures,
    repair_broken_group,
    repair_failed_download,
    repair_given_up,
    replace_after_node_loss,
)
from skulk.shared.telemetry_view import HEARTBEAT_WARN_S, NODE_TIMEOUT_S, NodeFreshness
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.common import TERMINAL_TASK_STATUSES
from skulk.shared.types.events import Event, InstanceDeleted, NodeTimedOut, TaskFailed
from skulk.shared.types.ids import EventId, InstanceId, ModelId, NodeId, TaskId
from skulk.shared.types.state import State
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import Task
from skulk.shared.types.telemetry import NodeResources

ZOMBIE_TASK_GRACE_S = 5.0
"""How long an open task may reference an instance that no longer exists before the master
fails it. A short grace lets a task whose instance was just deleted finish its own
teardown (a Shutdown completing, a Cancelled status landing) before it is reaped."""

NODE_LOST = StreamErrorType.NODE_LOST
INSTANCE_GONE = StreamErrorType.INSTANCE_GONE

IdFactory = Callable[[], str]


@dataclass(frozen=True)
class MasterView:
    """What one reconciliation pass reads. `now` is the shell's monotonic clock, the same
    one `zombie_since` values were taken on; `freshness` has an entry per node the shell
    has any liveness signal for (see `skulk.shared.telemetry_view.all_freshness`)."""

    state: State
    me: NodeId
    freshness: Mapping[NodeId, NodeFreshness] = field(default_factory=dict[NodeId, NodeFreshness])
    zombie_since: Mapping[TaskId, float] = field(default_factory=dict[TaskId, float])
    now: float = 0.0
    cards: Mapping[ModelId, ModelCard] = field(default_factory=dict[ModelId, ModelCard])
    """Model cards and gossiped resources, for repair re-placements."""
    resources: Mapping[NodeId, NodeResources] = field(default_factory=dict[NodeId, NodeResources])
    memory_credits: Mapping[NodeId, int] = field(default_factory=dict[NodeId, int])
    """Memory of recently deleted instances, credited back to placement (see repair)."""
    node_timeout_s: float = NODE_TIMEOUT_S
    """Silence after which a member is pruned (the shell may lower it for tests only)."""
    broken_since: Mapping[InstanceId, float] = field(default_factory=dict[InstanceId, float])
    """When each multi-rank instance with a rank failed after serving was first seen so:
    `track_broken_groups`."""
    presence_lost: Mapping[NodeId, float] = field(default_factory=dict[NodeId, float])
    """Members whose presence has been gone past the hysteresis and within their prune
    budget, with seconds gone (`skulk.master.presence_loss.lost_nodes`)."""


# -- helpers --------------------------------------------------------------------------------


def _is_open(task: Task) -> bool:
    return task.status not in TERMINAL_TASK_STATUSES


def _open_tasks_on(state: State, instance_ids: Iterable[InstanceId]) -> list[Task]:
    wanted = set(instance_ids)
    return [t for t in state.tasks.values() if t.instance_id in wanted and _is_open(t)]


def _instances_on(state: State, node_id: NodeId) -> list[InstanceId]:
    return [i for i, inst in state.instances.items() if node_id in inst.node_ids()]


def _fail(task: Task, error_type: StreamErrorType, message: str, new_id: IdFactory) -> TaskFailed:
    return TaskFailed(
        event_id=EventId(new_id()), task_id=task.task_id, error_type=error_type, error_message=message
    )


def _teardown(
    state: State, causes: Mapping[InstanceId, tuple[str, str]], new_id: IdFactory
) -> list[Event]:
    """TaskFailed for every open task on these instances (in State's task order), then
    their InstanceDeleted. `causes` maps each instance to (task message, delete reason)."""
    failed: list[Event] = [
        _fail(t, NODE_LOST, f"{causes[t.instance_id][0]}; instance {t.instance_id} is being torn down", new_id)
        for t in _open_tasks_on(state, causes)
    ]
    deleted: list[Event] = [
        InstanceDeleted(event_id=EventId(new_id()), instance_id=i, reason=reason)
        for i, (_message, reason) in causes.items()
    ]
    return failed + deleted


def _inputs(view: MasterView, new_id: IdFactory) -> RepairInputs:
    return RepairInputs(new_id=new_id, cards=view.cards, resources=view.resources,
                        memory_credits=view.memory_credits)


def _replace_lost(
    view: MasterView, causes: Mapping[InstanceId, tuple[str, str]], lost: Iterable[NodeId], new_id: IdFactory
) -> list[Event]:
    """The re-placement (or its abandonment) of every instance torn down for a lost node."""
    torn_down = [(view.state.instances[i], reason) for i, (_message, reason) in causes.items()]
    return replace_after_node_loss(view.state, torn_down, lost, _inputs(view, new_id))


def _timed_out(view: MasterView, node_id: NodeId) -> NodeFreshness | None:
    """The node's freshness if it has been silent too long; None if alive or unknown."""
    f = view.freshness.get(node_id)
    age = f.effective_age_s if f is not None else None
    return f if age is not None and age >= view.node_timeout_s else None


# -- rules ----------------------------------------------------------------------------------


class Verdict(TypedDict):
    """A NodeTimedOut's fields but its event id, which is drawn after the node's teardown's ids."""

    last_event_age_s: float
    heartbeat_age_s: float | None
    telemetry_age_s: float | None
    effective_age_s: float
    timeout_s: float
    cause: NotRequired[Literal["silence", "presence_lost"]]


def _prune(view: MasterView, verdicts: Mapping[NodeId, Verdict], new_id: IdFactory) -> list[Event] | None:
    """Per judged node (in node order): TaskFailed..., InstanceDeleted..., its NodeTimedOut;
    then each torn-down instance placed again on the survivors (or abandoned)."""
    events: list[Event] = []
    handled: set[InstanceId] = set()
    all_causes: dict[InstanceId, tuple[str, str]] = {}
    for node_id, verdict in verdicts.items():
        instances = [i for i in _instances_on(view.state, node_id) if i not in handled]
        handled.update(instances)
        age = verdict["effective_age_s"]
        if verdict.get("cause") == "presence_lost":
            cause = (f"node {node_id} lost: its presence left the cluster {age:.1f}s ago",
                     f"node {node_id} left the cluster's presence {age:.1f}s ago")
        else:
            cause = (f"node {node_id} lost: no sign of life for {age:.1f}s",
                     f"node {node_id} timed out after {age:.1f}s")
        all_causes.update({i: cause for i in instances})
        events += _teardown(view.state, {i: cause for i in instances}, new_id)
        events.append(NodeTimedOut(event_id=EventId(new_id()), node_id=node_id, **verdict))
    if not events:
        return None
    return events + _replace_lost(view, all_causes, list(verdicts), new_id)


def drop_nodes_without_presence(view: MasterView, new_id: IdFactory) -> list[Event] | None:
    """Prune every member (never the master) whose transport presence has been gone past
    the hysteresis (`view.presence_lost`, from `skulk.master.presence_loss`): the streams it
    served fail at once, naming it, and its instances are placed again on the survivors."""
    verdicts: dict[NodeId, Verdict] = {}
    for node_id in sorted(view.state.nodes):
        absent_s = view.presence_lost.get(node_id)
        if node_id == view.me or absent_s is None:
            continue
        f = view.freshness.get(node_id) or NodeFreshness()
        verdicts[node_id] = Verdict(
            last_event_age_s=f.last_event_age_s if f.last_event_age_s is not None else absent_s,
            heartbeat_age_s=f.heartbeat_age_s, telemetry_age_s=f.telemetry_age_s,
            effective_age_s=absent_s, timeout_s=PRESENCE_LOSS_CONFIRM_S, cause="presence_lost",
        )
    return _prune(view, verdicts, new_id)


def time_out_silent_nodes(view: MasterView, new_id: IdFactory) -> list[Event] | None:
    """Prune every member (never the master) whose freshest liveness signal is at least
    `view.node_timeout_s` (NODE_TIMEOUT_S) old: the backstop for a node that is silent but
    still present. A node with no signal at all is left alone: the shell has not been up
    long enough to judge it. Per node: TaskFailed..., InstanceDeleted..., NodeTimedOut;
    then each torn-down instance placed again on the survivors (or abandoned)."""
    verdicts: dict[NodeId, Verdict] = {}
    for node_id in sorted(view.state.nodes):
        f = _timed_out(view, node_id) if node_id != view.me else None
        if f is None:
            continue
        age = f.effective_age_s
        assert age is not None  # _timed_out only returns judged nodes
        verdicts[node_id] = Verdict(
            # NodeTimedOut requires a last-event age; a member that never logged an
            # event of its own is recorded as old as the signals that judged it.
            last_event_age_s=f.last_event_age_s if f.last_event_age_s is not None else age,
            heartbeat_age_s=f.heartbeat_age_s,
            telemetry_age_s=f.telemetry_age_s,
            effective_age_s=age,
            timeout_s=view.node_timeout_s,
        )
    return _prune(view, verdicts, new_id)


def delete_instances_on_departed_nodes(view: MasterView, new_id: IdFactory) -> list[Event] | None:
    """An instance with a shard on a node that is no longer a member (it left, or an earlier
    pass pruned it) can never serve: fail its open tasks, delete it, then place it again
    on the members that remain."""
    members = view.state.nodes
    causes: dict[InstanceId, tuple[str, str]] = {}
    lost: set[NodeId] = set()
    for instance_id, inst in view.state.instances.items():
        departed = {n for n in inst.node_ids() if n not in members}
        lost |= departed
        gone = ", ".join(sorted(departed))
        if gone:
            causes[instance_id] = (
                f"node {gone} lost: no longer a cluster member",
                f"node {gone} is no longer a cluster member",
            )
    if not causes:
        return None
    return _teardown(view.state, causes, new_id) + _replace_lost(view, causes, lost, new_id)


def repair_failed_downloads(view: MasterView, new_id: IdFactory) -> list[Event] | None:
    """A not-yet-serving instance whose rank's download failed terminally would wait for
    that rank forever: fail its requests, tear it down, re-place it without the node."""
    return repair_failed_download(view.state, _inputs(view, new_id))


BROKEN_GROUP_GRACE_S = 5.0
"""How long a serving group's failed rank is left before the group is re-placed, during which
every node of the instance must stay fresh. A rank whose node died fails its peers too
(their ring breaks), but that is node loss, handled at the node timeout with the lost node
left out; after this grace the dead node's liveness signals are this old and the broken
group is left to that rule. Two and a half heartbeat periods."""


def _fresh(view: MasterView, node_id: NodeId) -> bool:
    if node_id == view.me:
        return True
    f = view.freshness.get(node_id)
    age = f.effective_age_s if f is not None else None
    return age is not None and age < BROKEN_GROUP_GRACE_S


def repair_broken_groups(view: MasterView, new_id: IdFactory) -> list[Event] | None:
    """A multi-rank instance whose rank failed after serving at least BROKEN_GROUP_GRACE_S
    ago, all of whose nodes are alive: re-place it under a fresh id (`repair_broken_group`)."""
    due = frozenset(
        instance_id for instance_id, since in view.broken_since.items()
        if instance_id in view.state.instances
        and view.now - since >= BROKEN_GROUP_GRACE_S
        and all(_fresh(view, n) for n in view.state.instances[instance_id].node_ids())
    )
    return repair_broken_group(view.state, due, _inputs(view, new_id)) if due else None


def repair_given_up_runners(view: MasterView, new_id: IdFactory) -> list[Event] | None:
    """An instance with a runner its worker gave up on (the crash breaker tripped) would stay
    Failed for good: re-place it away from that node, or record why it cannot be
    (`repair_given_up`). No grace: the worker decided only after repeated crashes."""
    return repair_given_up(view.state, _inputs(view, new_id))


def reap_zombie_tasks(view: MasterView, new_id: IdFactory) -> list[Event] | None:
    """Fail open tasks whose instance has been gone for at least ZOMBIE_TASK_GRACE_S: their
    owner was deleted (a killed node returns with a new identity), so nobody else ever
    will. A task not yet in `zombie_since` has not been tracked long enough to judge."""
    events: list[Event] = []
    for task in view.state.tasks.values():
        if not _is_open(task) or task.instance_id in view.state.instances:
            continue
        since = view.zombie_since.get(task.task_id)
        if since is None or view.now - since < ZOMBIE_TASK_GRACE_S:
            continue
        events.append(
            _fail(
                task,
                INSTANCE_GONE,
                f"instance gone: {task.instance_id} no longer exists "
                f"(task open {view.now - since:.1f}s after it was deleted)",
                new_id,
            )
        )
    return events or None


def plan(view: MasterView, new_id: IdFactory) -> list[Event]:
    """The events to index next, most urgent decision first; [] when nothing is due."""
    return (
        drop_nodes_without_presence(view, new_id)
        or time_out_silent_nodes(view, new_id)
        or delete_instances_on_departed_nodes(view, new_id)
        or repair_failed_downloads(view, new_id)
        or repair_broken_groups(view, new_id)
        or repair_given_up_runners(view, new_id)
        or reap_zombie_tasks(view, new_id)
        or []
    )


# -- bookkeeping helpers for the shell ------------------------------------------------------


def zombie_task_ids(state: State) -> list[TaskId]:
    """Open tasks whose instance is not in State, in State's task order."""
    return [
        t.task_id for t in state.tasks.values() if _is_open(t) and t.instance_id not in state.instances
    ]


def track_zombies(state: State, previous: Mapping[TaskId, float], now: float) -> dict[TaskId, float]:
    """First-seen times of the current zombie tasks: kept from `previous` when already
    tracked, `now` for new ones; tasks that finished or disappeared are dropped."""
    return {t: previous.get(t, now) for t in zombie_task_ids(state)}


def track_broken_groups(
    state: State, previous: Mapping[InstanceId, float], now: float
) -> dict[InstanceId, float]:
    """First-seen times of the multi-rank instances that have a rank failed after serving."""
    return {i: previous.get(i, now) for i, instance in state.instances.items() if broken_group_failures(state, instance)}


def heartbeat_warnings(
    freshness: Mapping[NodeId, NodeFreshness], warned: frozenset[NodeId]
) -> tuple[frozenset[NodeId], frozenset[NodeId]]:
    """(newly late, recovered): nodes whose dedicated heartbeat gap just reached
    HEARTBEAT_WARN_S (warn once), and warned nodes whose heartbeat is back under it (log
    recovery once). A node with no heartbeat age is neither. The shell keeps
    `warned = ((warned | late) - recovered) & freshness.keys()` so pruned nodes drop out."""
    late = frozenset(
        n
        for n, f in freshness.items()
        if n not in warned and f.heartbeat_age_s is not None and f.heartbeat_age_s >= HEARTBEAT_WARN_S
    )
    recovered = frozenset(
        n
        for n in warned
        if (f := freshness.get(n)) is not None
        and f.heartbeat_age_s is not None
        and f.heartbeat_age_s < HEARTBEAT_WARN_S
    )
    return late, recovered


__all__ = [
    "BROKEN_GROUP_GRACE_S",
    "HEARTBEAT_WARN_S",
    "INSTANCE_GONE",
    "NODE_LOST",
    "NODE_TIMEOUT_S",
    "ZOMBIE_TASK_GRACE_S",
    "MasterView",
    "delete_instances_on_departed_nodes",
    "drop_nodes_without_presence",
    "heartbeat_warnings",
    "plan",
    "reap_zombie_tasks",
    "repair_broken_groups",
    "repair_failed_downloads",
    "repair_given_up_runners",
    "time_out_silent_nodes",
    "track_broken_groups",
    "track_zombies",
    "zombie_task_ids",
]
