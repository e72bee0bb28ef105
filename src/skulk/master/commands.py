"""The master's answer to each command: `decide(state, command, ctx) -> events`.

Pure. A command that cannot be honoured yields no events and a typed `Refusal` naming why;
the API dry-runs the same checks before it publishes, so a caller sees the reason as an
HTTP error rather than an acknowledged command that silently does nothing. A generation
request that cannot be served is the exception: it is recorded as a task created Failed,
so the owning API learns the reason from replicated State and the log explains it later.
A worker's RefuseInstancePlacement is answered by `skulk.master.repair` (teardown, then
a bounded re-placement). Commands whose capability has not landed yet (downloads) are
refused as `not_supported` until their issue wires them in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from skulk.master.placement import PlacementError, PlacementRequest, place
from skulk.master.repair import RepairInputs, repair_refused
from skulk.shared.serving import model_serving
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.commands import (
    AddCustomModelCard,
    CancelCommand,
    Command,
    CreateInstance,
    DeleteCustomModelCard,
    DeleteInstance,
    EvictStagedModel,
    GenerateText,
    PlaceInstance,
    RefuseInstancePlacement,
    RunWorkload,
    SetTracingEnabled,
    TaskFinished,
)
from skulk.shared.types.common import TERMINAL_TASK_STATUSES
from skulk.shared.types.events import (
    CustomModelCardAdded,
    CustomModelCardDeleted,
    Event,
    InstanceCreated,
    InstanceDeleted,
    StagedModelEvicted,
    TaskCreated,
    TaskDeleted,
    TaskStatusUpdated,
    TracingStateChanged,
)
from skulk.shared.types.ids import EventId, ModelId, NodeId
from skulk.shared.types.instances import Instance
from skulk.shared.types.state import State
from skulk.shared.types.tasks import Task, TextGeneration, WorkloadTask
from skulk.shared.types.telemetry import NodeResources


@dataclass(frozen=True)
class Refusal:
    code: str
    message: str


Decision = list[Event] | Refusal
NewId = Callable[[], str]

UNPLACED_INSTANCE = "unplaced"
"""instance_id of a generation task the master could not bind to any instance."""


@dataclass(frozen=True)
class DecisionContext:
    new_id: NewId
    origin: NodeId
    cards: Mapping[ModelId, ModelCard] = field(default_factory=dict[ModelId, ModelCard])
    resources: Mapping[NodeId, NodeResources] = field(default_factory=dict[NodeId, NodeResources])
    memory_credits: Mapping[NodeId, int] = field(default_factory=dict[NodeId, int])


def _set_tracing(state: State, command: SetTracingEnabled, ctx: DecisionContext) -> Decision:
    if state.tracing_enabled == command.enabled:
        return []  # already so: the log records changes, not requests
    return [TracingStateChanged(event_id=EventId(ctx.new_id()), enabled=command.enabled)]


def _create_instance(state: State, command: CreateInstance, ctx: DecisionContext) -> Decision:
    instance = command.instance
    if instance.instance_id in state.instances:
        return Refusal("instance_exists", f"instance {instance.instance_id} already exists")
    missing = sorted({s.node_id for s in instance.shards} - set(state.nodes))
    if missing:
        return Refusal("unknown_nodes", f"instance names nodes that are not members: {', '.join(missing)}")
    return [InstanceCreated(event_id=EventId(ctx.new_id()), instance=instance)]


def _delete_instance(state: State, command: DeleteInstance, ctx: DecisionContext) -> Decision:
    if command.instance_id not in state.instances:
        return Refusal("unknown_instance", f"no instance {command.instance_id}")
    cancelled = [
        TaskStatusUpdated(event_id=EventId(ctx.new_id()), task_id=task.task_id, status="Cancelled",
                          error_message=f"instance {command.instance_id} deleted by operator")
        for task in sorted(state.tasks.values(), key=lambda t: t.task_id)
        if task.instance_id == command.instance_id and task.status not in TERMINAL_TASK_STATUSES
    ]
    return [*cancelled, InstanceDeleted(event_id=EventId(ctx.new_id()), instance_id=command.instance_id, reason="deleted by operator")]


def _evict(state: State, command: EvictStagedModel, ctx: DecisionContext) -> Decision:
    return [StagedModelEvicted(event_id=EventId(ctx.new_id()), model_id=command.model_id)]


def ready_instance_for(state: State, model_id: str) -> Instance | None:
    """The instance to bind a new request to: every runner serving, fewest open tasks; else
    one still coming up (the request waits for its load). An instance with a runner down
    (failed, shutting down) never takes a request: it would wait for a frame that never comes."""
    open_tasks: dict[str, int] = {}
    for task in state.tasks.values():
        if task.status not in TERMINAL_TASK_STATUSES:
            open_tasks[task.instance_id] = open_tasks.get(task.instance_id, 0) + 1
    verdict = model_serving(state, model_id)
    candidates = verdict.serving or verdict.loading
    if not candidates:
        return None
    return min(candidates, key=lambda i: (open_tasks.get(i.instance_id, 0), i.instance_id))


def unplaced_message(state: State, model_id: str) -> str:
    """Why a request for `model_id` has no instance to run on: every placed instance has a
    runner down (naming each runner's node, state and reason), or none is placed (naming the
    fix, and the abandoned repair when that is why the model is gone)."""
    verdict = model_serving(state, model_id)
    if verdict.refused:
        return verdict.refusal()
    failure = state.repair_failures.get(ModelId(model_id))
    why = f" (its last placement could not be repaired: {failure.reason})" if failure is not None else ""
    return f"no instance of {model_id} is placed{why}; place it first: POST /place_instance {{\"modelId\": \"{model_id}\"}}"


def _bind(state: State, command: GenerateText | RunWorkload, ctx: DecisionContext, task_type: type) -> Decision:
    """An API request becomes a task on the least busy serving instance of its model, or a
    task born failed that names the fix (and an abandoned repair, when that is the cause).
    A command that already has its task is bound once only: the API publishes a command again
    until its task is logged (`skulk.cluster.command_resend`), so a copy may cross the original."""
    if _tasks_of_command(state, command.command_id):
        return []
    instance = ready_instance_for(state, command.params.model_id)
    task = task_type(
        task_id=ctx.new_id(),
        instance_id=instance.instance_id if instance else UNPLACED_INSTANCE,
        command_id=command.command_id,
        owner_node_id=ctx.origin,
        params=command.params,
        **({"traced": True} if getattr(command, "traced", False) else {}),
    )
    if instance is None:
        task = task.model_copy(update={"status": "Failed", "error_message": unplaced_message(state, command.params.model_id)})
    return [TaskCreated(event_id=EventId(ctx.new_id()), task=task)]


def _generate(state: State, command: GenerateText, ctx: DecisionContext) -> Decision:
    return _bind(state, command, ctx, TextGeneration)


def _run_workload(state: State, command: RunWorkload, ctx: DecisionContext) -> Decision:
    return _bind(state, command, ctx, WorkloadTask)


def _tasks_of_command(state: State, command_id: str) -> list[Task]:
    return sorted(
        (t for t in state.tasks.values() if getattr(t, "command_id", None) == command_id), key=lambda t: t.task_id
    )


def _task_finished(state: State, command: TaskFinished, ctx: DecisionContext) -> Decision:
    return [TaskDeleted(event_id=EventId(ctx.new_id()), task_id=t.task_id) for t in _tasks_of_command(state, command.finished_command_id)]


def _cancel(state: State, command: CancelCommand, ctx: DecisionContext) -> Decision:
    """Cancel what still runs, then forget the command's tasks: the API that sent this has
    already ended the client's stream, so nobody will send TaskFinished for them."""
    tasks = _tasks_of_command(state, command.cancelled_command_id)
    cancelled = [
        TaskStatusUpdated(event_id=EventId(ctx.new_id()), task_id=t.task_id, status="Cancelled", error_message="cancelled by the client")
        for t in tasks
        if t.status not in TERMINAL_TASK_STATUSES
    ]
    return [*cancelled, *(TaskDeleted(event_id=EventId(ctx.new_id()), task_id=t.task_id) for t in tasks)]


def _place(state: State, command: PlaceInstance, ctx: DecisionContext) -> Decision:
    if command.instance_id is not None and command.instance_id in state.instances:
        return []  # a copy of a command already placed: placing is idempotent per instance id
    card = ctx.cards.get(command.model_id)
    if card is None:
        return Refusal("unknown_model", f"no model card for {command.model_id}")
    request = PlacementRequest.from_command(command)
    try:
        instance = place(card, state, ctx.resources, request, new_id=ctx.new_id, memory_credits=ctx.memory_credits)
    except PlacementError as exc:
        return Refusal(exc.code, str(exc))
    if command.instance_id is not None:
        instance = instance.model_copy(update={"instance_id": command.instance_id})
    if command.idle_ttl_s is not None:
        instance = instance.model_copy(update={"idle_ttl_s": command.idle_ttl_s})
    return [InstanceCreated(event_id=EventId(ctx.new_id()), instance=instance)]


def _refuse_placement(state: State, command: RefuseInstancePlacement, ctx: DecisionContext) -> Decision:
    instance = state.instances.get(command.instance_id)
    if instance is None:
        return Refusal("unknown_instance", f"no instance {command.instance_id} (already repaired or deleted)")
    if command.node_id != ctx.origin:
        return Refusal("not_the_refuser", f"node {ctx.origin} cannot refuse a shard on behalf of {command.node_id}")
    if command.node_id not in instance.node_ids():
        return Refusal("not_a_host", f"node {command.node_id} hosts no shard of instance {command.instance_id}")
    inputs = RepairInputs(new_id=ctx.new_id, cards=ctx.cards, resources=ctx.resources, memory_credits=ctx.memory_credits)
    return repair_refused(state, instance, command, inputs)


def _add_card(state: State, command: AddCustomModelCard, ctx: DecisionContext) -> Decision:
    if state.custom_cards.get(command.card.model_id) == command.card:
        return []
    return [CustomModelCardAdded(event_id=EventId(ctx.new_id()), card=command.card)]


def _delete_card(state: State, command: DeleteCustomModelCard, ctx: DecisionContext) -> Decision:
    if command.model_id not in state.custom_cards:
        return Refusal("unknown_card", f"no custom card {command.model_id}")
    return [CustomModelCardDeleted(event_id=EventId(ctx.new_id()), model_id=command.model_id)]


_DECIDERS: dict[type, Callable[[State, Any, DecisionContext], Decision]] = {
    SetTracingEnabled: _set_tracing,
    GenerateText: _generate,
    RunWorkload: _run_workload,
    TaskFinished: _task_finished,
    CancelCommand: _cancel,
    PlaceInstance: _place,
    CreateInstance: _create_instance,
    DeleteInstance: _delete_instance,
    RefuseInstancePlacement: _refuse_placement,
    EvictStagedModel: _evict,
    AddCustomModelCard: _add_card,
    DeleteCustomModelCard: _delete_card,
}


def decide(state: State, command: Command, ctx: DecisionContext) -> Decision:
    decider = _DECIDERS.get(type(command))
    if decider is None:
        return Refusal("not_supported", f"{type(command).__name__} is not handled by this master yet")
    return decider(state, command, ctx)
