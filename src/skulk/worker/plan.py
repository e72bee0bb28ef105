"""The worker's next step: `plan(view) -> WorkerAction | None`.

Pure. The view is replicated State plus what only this node knows (its runner supervisors,
resolved model artifacts, tasks it has handed to runners, live free memory). Rules are tried
in priority order and the first that applies wins; the shell carries the action out and
asks again, so one action at a time converges the node on what State says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from skulk.shared.memory_estimate import assignment_footprint
from skulk.shared.serving import runner_serving
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.common import TERMINAL_TASK_STATUSES
from skulk.shared.types.ids import CommandId, InstanceId, ModelId, NodeId, RunnerId, TaskId
from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import State
from skulk.shared.types.tasks import ApiTask

MEMORY_FIT_TOLERANCE = 0.10
"""The pre-spawn guard allows a shard to exceed live free memory by this fraction of it: the
footprint already includes overhead, a full KV reservation and a floor, and live readings
jitter against the gossiped figure the master admitted on (seed: a 2 % miss once refused a
24B model that ran fine)."""

@dataclass(frozen=True)
class LocalRunner:
    runner_id: RunnerId
    instance_id: InstanceId
    status: RunnerStatus
    in_flight: frozenset[TaskId] = frozenset()


@dataclass(frozen=True)
class WorkerView:
    node_id: NodeId
    state: State
    cards: Mapping[ModelId, ModelCard]
    runners: Mapping[RunnerId, LocalRunner] = field(default_factory=dict[RunnerId, LocalRunner])
    artifacts: Mapping[ModelId, str] = field(default_factory=dict[ModelId, str])
    artifact_failures: Mapping[ModelId, str] = field(default_factory=dict[ModelId, str])
    resolving: frozenset[ModelId] = frozenset()
    dispatched: frozenset[TaskId] = frozenset()
    given_up: frozenset[RunnerId] = frozenset()
    reported_failed: frozenset[RunnerId] = frozenset()
    ram_available_bytes: int | None = None
    task_inputs: frozenset[CommandId] = frozenset()
    """Commands whose full params (their text, kept out of State) have reached this node."""


@dataclass(frozen=True)
class StopRunner:
    runner_id: RunnerId
    reason: str


@dataclass(frozen=True)
class CancelRunnerTask:
    runner_id: RunnerId
    task_id: TaskId


@dataclass(frozen=True)
class ReportRunnerFailed:
    runner_id: RunnerId
    message: str


@dataclass(frozen=True)
class RefusePlacement:
    """The pre-spawn guard refused this node's shard: the shell marks the runner failed and
    sends RefuseInstancePlacement, so the master re-places the model (one node wider, then
    a single other node) instead of the placement silently failing."""

    runner_id: RunnerId
    instance_id: InstanceId
    needed_bytes: int
    available_bytes: int
    message: str


@dataclass(frozen=True)
class ResolveArtifact:
    model_id: ModelId


@dataclass(frozen=True)
class SpawnRunner:
    instance: Instance
    shard: ShardAssignment
    card: ModelCard
    model_path: str


@dataclass(frozen=True)
class DispatchTask:
    runner_id: RunnerId
    task: ApiTask


WorkerAction = (
    StopRunner | CancelRunnerTask | ReportRunnerFailed | RefusePlacement | ResolveArtifact | SpawnRunner | DispatchTask
)


def _my_shards(view: WorkerView) -> list[tuple[Instance, ShardAssignment]]:
    return [
        (instance, shard)
        for _, instance in sorted(view.state.instances.items())
        for shard in instance.shards
        if shard.node_id == view.node_id
    ]


def stop_orphaned_runners(view: WorkerView) -> WorkerAction | None:
    for runner_id, runner in sorted(view.runners.items()):
        instance = view.state.instances.get(runner.instance_id)
        if instance is None or runner_id not in instance.runner_ids():
            return StopRunner(runner_id, f"instance {runner.instance_id} is gone")
    return None


def cancel_abandoned_tasks(view: WorkerView) -> WorkerAction | None:
    for runner_id, runner in sorted(view.runners.items()):
        for task_id in sorted(runner.in_flight):
            task = view.state.tasks.get(task_id)
            if task is None or task.status in TERMINAL_TASK_STATUSES:
                return CancelRunnerTask(runner_id, task_id)
    return None


def report_unservable_shards(view: WorkerView) -> WorkerAction | None:
    for instance, shard in _my_shards(view):
        failure = view.artifact_failures.get(instance.model_id)
        if failure and shard.runner_id not in view.reported_failed:
            return ReportRunnerFailed(shard.runner_id, f"model {instance.model_id} unavailable: {failure}")
    return None


def resolve_missing_artifacts(view: WorkerView) -> WorkerAction | None:
    for instance, _shard in _my_shards(view):
        model = instance.model_id
        if model not in view.artifacts and model not in view.artifact_failures and model not in view.resolving:
            return ResolveArtifact(model)
    return None


def refuse_shards_that_do_not_fit(view: WorkerView) -> WorkerAction | None:
    """The last-resort guard below the master's admission: live memory, with a tolerance."""
    if view.ram_available_bytes is None:
        return None
    for instance, shard in _my_shards(view):
        card = view.cards.get(instance.model_id)
        if card is None or shard.runner_id in view.runners or shard.runner_id in view.reported_failed:
            continue
        needed = assignment_footprint(card, shard).total_bytes
        allowed = view.ram_available_bytes * (1 + MEMORY_FIT_TOLERANCE)
        if needed > allowed:
            return RefusePlacement(
                runner_id=shard.runner_id,
                instance_id=instance.instance_id,
                needed_bytes=needed,
                available_bytes=view.ram_available_bytes,
                message=f"shard of {instance.model_id} needs {needed / 1e9:.2f} GB but only "
                f"{view.ram_available_bytes / 1e9:.2f} GB is free (+{MEMORY_FIT_TOLERANCE:.0%} tolerance)",
            )
    return None


def start_missing_runners(view: WorkerView) -> WorkerAction | None:
    for instance, shard in _my_shards(view):
        runner_id = shard.runner_id
        if runner_id in view.runners or runner_id in view.given_up or runner_id in view.reported_failed:
            continue
        path = view.artifacts.get(instance.model_id)
        card = view.cards.get(instance.model_id)
        if path is not None and card is not None:
            return SpawnRunner(instance, shard, card, path)
    return None


def still_unconfirmed(done: frozenset[TaskId], state: State) -> frozenset[TaskId]:
    """Tasks a runner finished whose terminal status State does not show yet (the
    TaskStatusUpdated is on its way through the master). They must still count as
    dispatched: a task dispatched again in that window runs a second time (seen in traces
    as a second dispatch of a finished command, cancelled a few tokens in)."""
    return frozenset(
        t for t in done if (task := state.tasks.get(t)) is not None and task.status not in TERMINAL_TASK_STATUSES
    )


def dispatch_pending_tasks(view: WorkerView) -> WorkerAction | None:
    for task_id, task in sorted(view.state.tasks.items()):
        if task.status in TERMINAL_TASK_STATUSES:
            continue
        if task_id in view.dispatched or task.command_id not in view.task_inputs:
            continue
        instance = view.state.instances.get(task.instance_id)
        if instance is None:
            continue
        first = instance.shards[0]
        runner = view.runners.get(first.runner_id)
        if first.node_id == view.node_id and runner is not None and runner_serving(runner.status):
            return DispatchTask(first.runner_id, task)
    return None


@dataclass(frozen=True)
class RestartRunner:
    """A failed runner is restarted by the next planning pass (its shard is still placed)."""


@dataclass(frozen=True)
class GiveUpRunner:
    """A failed runner is not restarted: the worker reports it Failed with `gave_up` set
    (`given_up_status`), and the master re-places its instance away from this node, a
    multi-rank group that broke while serving by `repair_broken_group`, anything else by
    `repair_given_up` (bounded by MAX_REPAIR_HOP; when no other node admits it, the instance
    stays Failed with the reason in State and requests get a typed 503). `reason` says why."""

    reason: str


def after_runner_failure(world_size: int, served: bool, breaker_tripped: bool) -> RestartRunner | GiveUpRunner:
    """Restart a failed runner, or give up on it.

    A rank of a multi-rank group that failed after serving is never restarted: a lone
    restarted rank can never rejoin a group that formed without it, so the master re-places
    the whole group under a fresh id. Otherwise the crash breaker decides: a runner that keeps
    failing is given up here, and the master re-places its instance on another node."""
    if world_size > 1 and served:
        return GiveUpRunner("failed after serving in a multi-rank group; the group is re-placed")
    if breaker_tripped:
        return GiveUpRunner("keeps failing: the crash breaker tripped, the worker will not restart it")
    return RestartRunner()


def given_up_status(status: RunnerStatus, verdict: GiveUpRunner) -> RunnerStatus:
    """The Failed status the worker reports once it gave up on a runner: `gave_up` set and
    the reason first, so State (and the 503 a request gets) says the worker stopped trying,
    not only how the last attempt ended."""
    last = status.error_message or "no reason given"
    return status.model_copy(update={"gave_up": True, "error_message": f"{verdict.reason}; last failure: {last}"})


def plan(view: WorkerView) -> WorkerAction | None:
    return (
        stop_orphaned_runners(view)
        or cancel_abandoned_tasks(view)
        or report_unservable_shards(view)
        or resolve_missing_artifacts(view)
        or refuse_shards_that_do_not_fit(view)
        or start_missing_runners(view)
        or dispatch_pending_tasks(view)
    )
