"""The master's answer to each command: `decide(state, command, new_id) -> events`.

Pure. A command that cannot be honoured yields no events and a typed `Refusal` naming why;
the API dry-runs the same checks before it publishes, so a caller sees the reason as an
HTTP error rather than an acknowledged command that silently does nothing. Commands whose
capability has not landed yet (placement, generation, downloads) are refused as
`not_supported` until their issue wires them in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from skulk.shared.types.commands import (
    AddCustomModelCard,
    Command,
    CreateInstance,
    DeleteCustomModelCard,
    DeleteInstance,
    EvictStagedModel,
    SetTracingEnabled,
)
from skulk.shared.types.common import TERMINAL_TASK_STATUSES
from skulk.shared.types.events import (
    CustomModelCardAdded,
    CustomModelCardDeleted,
    Event,
    InstanceCreated,
    InstanceDeleted,
    StagedModelEvicted,
    TaskStatusUpdated,
    TracingStateChanged,
)
from skulk.shared.types.state import State


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str


Decision = list[Event] | Refusal
NewId = Callable[[], str]


def _set_tracing(state: State, command: SetTracingEnabled, new_id: NewId) -> Decision:
    if state.tracing_enabled == command.enabled:
        return []  # already so: the log records changes, not requests
    return [TracingStateChanged(event_id=new_id(), enabled=command.enabled)]


def _create_instance(state: State, command: CreateInstance, new_id: NewId) -> Decision:
    instance = command.instance
    if instance.instance_id in state.instances:
        return Refusal("instance_exists", f"instance {instance.instance_id} already exists")
    missing = sorted({s.node_id for s in instance.shards} - set(state.nodes))
    if missing:
        return Refusal("unknown_nodes", f"instance names nodes that are not members: {', '.join(missing)}")
    return [InstanceCreated(event_id=new_id(), instance=instance)]


def _delete_instance(state: State, command: DeleteInstance, new_id: NewId) -> Decision:
    if command.instance_id not in state.instances:
        return Refusal("unknown_instance", f"no instance {command.instance_id}")
    cancelled = [
        TaskStatusUpdated(event_id=new_id(), task_id=task.task_id, status="Cancelled",
                          error_message=f"instance {command.instance_id} deleted by operator")
        for task in sorted(state.tasks.values(), key=lambda t: t.task_id)
        if task.instance_id == command.instance_id and task.status not in TERMINAL_TASK_STATUSES
    ]
    return [*cancelled, InstanceDeleted(event_id=new_id(), instance_id=command.instance_id, reason="deleted by operator")]


def _evict(state: State, command: EvictStagedModel, new_id: NewId) -> Decision:
    return [StagedModelEvicted(event_id=new_id(), model_id=command.model_id)]


def _add_card(state: State, command: AddCustomModelCard, new_id: NewId) -> Decision:
    if state.custom_cards.get(command.card.model_id) == command.card:
        return []
    return [CustomModelCardAdded(event_id=new_id(), card=command.card)]


def _delete_card(state: State, command: DeleteCustomModelCard, new_id: NewId) -> Decision:
    if command.model_id not in state.custom_cards:
        return Refusal("unknown_card", f"no custom card {command.model_id}")
    return [CustomModelCardDeleted(event_id=new_id(), model_id=command.model_id)]


_DECIDERS: dict[type, Callable[[State, object, NewId], Decision]] = {
    SetTracingEnabled: _set_tracing,
    CreateInstance: _create_instance,
    DeleteInstance: _delete_instance,
    EvictStagedModel: _evict,
    AddCustomModelCard: _add_card,
    DeleteCustomModelCard: _delete_card,
}


def decide(state: State, command: Command, new_id: NewId) -> Decision:
    decider = _DECIDERS.get(type(command))
    if decider is None:
        return Refusal("not_supported", f"{type(command).__name__} is not handled by this master yet")
    return decider(state, command, new_id)
