"""The pure reducer: `apply(state, indexed_event) -> state`.

Every node folds the same indexed events in the same order and must land on byte-identical
State, so nothing here reads a clock, mints an id, does I/O, iterates an unordered set into
output, or mutates its input (successors are built with `model_copy(update=...)` and fresh
dicts). One small function per event type, chosen from `_APPLIERS`. Events that name ids
the state does not know are harmless no-ops: late or duplicate facts must never raise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, get_args

from skulk.shared.codec import canonical_bytes
from skulk.shared.types.common import TERMINAL_TASK_STATUSES, canonical_edges
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
from skulk.shared.types.ids import ModelId, NodeId, TaskId
from skulk.shared.types.state import (
    DownloadStatus,
    DownloadStatusCompleted,
    DownloadStatusFailed,
    DownloadStatusPending,
    NodeInfo,
    RepairFailure,
    State,
)

K = TypeVar("K")
V = TypeVar("V")


class EventOutOfOrder(ValueError):
    """An indexed event that is not the next one for this state (a gap or a replay)."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"expected event idx {expected}, got {got}")
        self.expected = expected
        self.got = got


# -- small pure helpers --------------------------------------------------------------------


def _with(d: Mapping[K, V], key: K, value: V) -> dict[K, V]:
    return {**d, key: value}


def _without(d: Mapping[K, V], *keys: K) -> dict[K, V]:
    return {k: v for k, v in d.items() if k not in keys}


def _set_download(
    state: State, node_id: NodeId, model_id: ModelId, status: DownloadStatus
) -> State:
    if node_id not in state.nodes:
        return state  # a late outcome from a node already pruned must not resurrect it
    per_node = _with(state.downloads.get(node_id, {}), model_id, status)
    return state.model_copy(update={"downloads": _with(state.downloads, node_id, per_node)})


def _set_task_fields(state: State, task_id: TaskId, **fields: Any) -> State:
    task = state.tasks[task_id]
    updated = task.model_copy(update=fields)
    return state.model_copy(update={"tasks": _with(state.tasks, task_id, updated)})


def _is_open(state: State, task_id: TaskId) -> bool:
    task = state.tasks.get(task_id)
    return task is not None and task.status not in TERMINAL_TASK_STATUSES


# -- membership and topology ---------------------------------------------------------------


def _node_joined(state: State, e: NodeJoined) -> State:
    previous = state.nodes.get(e.node_id)
    info = NodeInfo(
        node_id=e.node_id,
        node_name=e.node_name,
        version=e.version,
        api_endpoint=e.api_endpoint,
        last_seen=previous.last_seen if previous else None,
    )
    return state.model_copy(update={"nodes": _with(state.nodes, e.node_id, info)})


def _node_removed(state: State, e: NodeLeft | NodeTimedOut) -> State:
    # Instances on the node are torn down by the master's explicit InstanceDeleted events
    # (indexed after the TaskFailed events they imply), not implicitly here.
    return state.model_copy(
        update={
            "nodes": _without(state.nodes, e.node_id),
            "edges": [edge for edge in state.edges if not edge.touches(e.node_id)],
            "node_network": _without(state.node_network, e.node_id),
            "downloads": _without(state.downloads, e.node_id),
        }
    )


def _node_network_updated(state: State, e: NodeNetworkUpdated) -> State:
    if e.node_id not in state.nodes:
        return state
    return state.model_copy(
        update={"node_network": _with(state.node_network, e.node_id, list(e.interfaces))}
    )


def _edge_created(state: State, e: TopologyEdgeCreated) -> State:
    # Either end may be a graph-only node that has not joined yet.
    if e.edge in state.edges:
        return state
    return state.model_copy(update={"edges": canonical_edges([*state.edges, e.edge])})


def _edge_deleted(state: State, e: TopologyEdgeDeleted) -> State:
    # Deleting a phantom's last edge also removes it from the graph: it only exists there.
    if e.edge not in state.edges:
        return state
    return state.model_copy(update={"edges": [edge for edge in state.edges if edge != e.edge]})


# -- instances and runners -----------------------------------------------------------------


def _instance_created(state: State, e: InstanceCreated) -> State:
    if e.instance.instance_id in state.instances:
        return state  # an instance id is created once; a duplicate is ignored
    # A new placement of the model supersedes any earlier abandoned repair of it.
    return state.model_copy(
        update={
            "instances": _with(state.instances, e.instance.instance_id, e.instance),
            "repair_failures": _without(state.repair_failures, e.instance.model_id),
        }
    )


def _instance_deleted(state: State, e: InstanceDeleted) -> State:
    instance = state.instances.get(e.instance_id)
    if instance is None:
        return state
    return state.model_copy(
        update={
            "instances": _without(state.instances, e.instance_id),
            "runners": _without(state.runners, *instance.runner_ids()),
        }
    )


def _repair_abandoned(state: State, e: InstanceRepairAbandoned) -> State:
    failure = RepairFailure(instance_id=e.instance_id, node_id=e.node_id, repair_hop=e.repair_hop, reason=e.reason)
    return state.model_copy(update={"repair_failures": _with(state.repair_failures, e.model_id, failure)})


def _runner_status_updated(state: State, e: RunnerStatusUpdated) -> State:
    # A late status from a runner whose instance is gone would otherwise leave a zombie.
    if e.runner_id not in state.runner_ids():
        return state
    return state.model_copy(update={"runners": _with(state.runners, e.runner_id, e.status)})


def _runner_deleted(state: State, e: RunnerDeleted) -> State:
    if e.runner_id not in state.runners:
        return state
    return state.model_copy(update={"runners": _without(state.runners, e.runner_id)})


# -- tasks ---------------------------------------------------------------------------------


def _task_created(state: State, e: TaskCreated) -> State:
    if e.task.task_id in state.tasks:
        return state  # a task id is created once; a duplicate is ignored
    return state.model_copy(update={"tasks": _with(state.tasks, e.task.task_id, e.task)})


def _task_acknowledged(state: State, e: TaskAcknowledged) -> State:
    task = state.tasks.get(e.task_id)
    if task is None or task.status != "Pending":
        return state
    return _set_task_fields(state, e.task_id, status="Running")


def _task_status_updated(state: State, e: TaskStatusUpdated) -> State:
    # Terminal is sticky: a runner's late "Running" must not reopen a cancelled task.
    if not _is_open(state, e.task_id):
        return state
    if e.status == "Failed" and e.error_type is not None:
        return _set_task_fields(state, e.task_id, status=e.status, error_type=e.error_type,
                                error_message=e.error_message)
    return _set_task_fields(state, e.task_id, status=e.status, error_message=e.error_message)


def _task_failed(state: State, e: TaskFailed) -> State:
    if not _is_open(state, e.task_id):
        return state
    return _set_task_fields(state, e.task_id, status="Failed", error_type=e.error_type,
                           error_message=e.error_message)


def _task_deleted(state: State, e: TaskDeleted) -> State:
    if e.task_id not in state.tasks:
        return state
    return state.model_copy(update={"tasks": _without(state.tasks, e.task_id)})


# -- downloads -----------------------------------------------------------------------------


def _download_pending(state: State, e: DownloadPending) -> State:
    status = DownloadStatusPending(attempt_id=e.attempt_id)
    return _set_download(state, e.node_id, e.model_id, status)


def _download_completed(state: State, e: DownloadCompleted) -> State:
    status = DownloadStatusCompleted(attempt_id=e.attempt_id, total_bytes=e.total_bytes)
    return _set_download(state, e.node_id, e.model_id, status)


def _download_failed(state: State, e: DownloadFailed) -> State:
    status = DownloadStatusFailed(attempt_id=e.attempt_id, error_message=e.error_message)
    return _set_download(state, e.node_id, e.model_id, status)


def _staged_model_evicted(state: State, e: StagedModelEvicted) -> State:
    targets = set(state.downloads) if e.node_ids is None else set(e.node_ids)
    downloads: dict[NodeId, dict[ModelId, DownloadStatus]] = {}
    changed = False
    for node_id, per_node in state.downloads.items():
        if node_id in targets and isinstance(per_node.get(e.model_id), DownloadStatusCompleted):
            per_node = _without(per_node, e.model_id)
            changed = True
        if per_node:  # never keep an empty per-node map: absent and empty must hash alike
            downloads[node_id] = per_node
    return state.model_copy(update={"downloads": downloads}) if changed else state


# -- no State effect -----------------------------------------------------------------------


def _custom_card_added(state: State, e: CustomModelCardAdded) -> State:
    return state.model_copy(update={"custom_cards": _with(state.custom_cards, e.card.model_id, e.card)})


def _custom_card_deleted(state: State, e: CustomModelCardDeleted) -> State:
    if e.model_id not in state.custom_cards:
        return state
    return state.model_copy(update={"custom_cards": _without(state.custom_cards, e.model_id)})


def _no_change(state: State, _e: InstancePlacementRefused | DownloadOngoing) -> State:
    # Refusals drive the master's re-placement; Ongoing progress lives on telemetry.
    return state


def _tracing_state_changed(state: State, e: TracingStateChanged) -> State:
    return state.model_copy(update={"tracing_enabled": e.enabled})


_APPLIERS: dict[type, Callable[[State, Any], State]] = {
    NodeJoined: _node_joined,
    NodeLeft: _node_removed,
    NodeTimedOut: _node_removed,
    NodeNetworkUpdated: _node_network_updated,
    TopologyEdgeCreated: _edge_created,
    TopologyEdgeDeleted: _edge_deleted,
    InstanceCreated: _instance_created,
    InstanceDeleted: _instance_deleted,
    InstancePlacementRefused: _no_change,
    InstanceRepairAbandoned: _repair_abandoned,
    RunnerStatusUpdated: _runner_status_updated,
    RunnerDeleted: _runner_deleted,
    TaskCreated: _task_created,
    TaskAcknowledged: _task_acknowledged,
    TaskStatusUpdated: _task_status_updated,
    TaskFailed: _task_failed,
    TaskDeleted: _task_deleted,
    DownloadPending: _download_pending,
    DownloadOngoing: _no_change,
    DownloadCompleted: _download_completed,
    DownloadFailed: _download_failed,
    TracingStateChanged: _tracing_state_changed,
    StagedModelEvicted: _staged_model_evicted,
    CustomModelCardAdded: _custom_card_added,
    CustomModelCardDeleted: _custom_card_deleted,
}

EVENT_TYPES: tuple[type, ...] = get_args(get_args(Event)[0])
"""Every member of the Event union, in declaration order."""

_missing = set(EVENT_TYPES) - set(_APPLIERS)
if _missing:  # fail at import, not on the first replay that meets the new event
    raise RuntimeError(f"events without an applier: {sorted(t.__name__ for t in _missing)}")


# -- entry points --------------------------------------------------------------------------


def apply(state: State, indexed: IndexedEvent) -> State:
    """The successor of `state` after `indexed`. Raises EventOutOfOrder (leaving `state`
    untouched) unless `indexed.idx` is exactly the next index."""
    expected = state.last_event_applied_idx + 1
    if indexed.idx != expected:
        raise EventOutOfOrder(expected, indexed.idx)
    after = _APPLIERS[type(indexed.event)](state, indexed.event)
    update: dict[str, Any] = {"last_event_applied_idx": indexed.idx}
    origin = after.nodes.get(indexed.origin)
    if origin is not None:
        # last_seen means "last logged event", never liveness (that is telemetry's job).
        seen = origin.model_copy(update={"last_seen": indexed.indexed_at})
        update["nodes"] = _with(after.nodes, indexed.origin, seen)
    return after.model_copy(update=update)


def apply_all(state: State, events: Iterable[IndexedEvent]) -> State:
    for indexed in events:
        state = apply(state, indexed)
    return state


def state_hash(state: State) -> str:
    """sha256 hex of the canonical bytes: equal on every node that applied the same log."""
    return hashlib.sha256(canonical_bytes(state)).hexdigest()


__all__ = ["EVENT_TYPES", "EventOutOfOrder", "apply", "apply_all", "state_hash"]
