"""Can a model take a request now: serve it, wait for a load, or refuse it at once?

A request bound to an instance whose runner has failed would wait for a first frame that
never comes (FIRST_FRAME_DEADLINE_S, two minutes). `model_serving` classifies the placed
instances of a model from State so the API (before it submits) and the master (when it binds
the task) refuse such a request at once, naming the runner's state and reason, and wait only
for instances that are still coming up.

Pure: State in, a verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from skulk.shared.types.instances import Instance, RunnerStatus
from skulk.shared.types.state import State

SERVING_RUNNER_STATES: Final = frozenset({"Ready", "Running"})
"""A runner in one of these states takes requests."""

DOWN_RUNNER_STATES: Final = frozenset({"Failed", "ShuttingDown", "Shutdown"})
"""A runner in one of these states will never answer a request bound to it now; any other
state (or no status yet: the runner is being created) is on its way to serving."""


@dataclass(frozen=True)
class RunnerDown:
    """Why one instance cannot serve: its first runner that is down."""

    instance_id: str
    runner_id: str
    node_id: str
    state: str
    reason: str | None


@dataclass(frozen=True)
class ModelServing:
    """What the placed instances of one model can do. `serving` and `loading` are in
    instance-id order; `down` has one entry per instance that can never serve as placed."""

    model_id: str
    serving: tuple[Instance, ...] = ()
    loading: tuple[Instance, ...] = ()
    down: tuple[RunnerDown, ...] = ()

    @property
    def placed(self) -> bool:
        return bool(self.serving or self.loading or self.down)

    @property
    def refused(self) -> bool:
        """Placed, yet no instance serves or is coming up: refuse now rather than wait."""
        return self.placed and not (self.serving or self.loading)

    def refusal(self) -> str:
        """Why the model cannot serve, naming each down runner's node, state and reason."""
        parts = [
            f"runner {d.runner_id} on node {d.node_id} is {d.state}" + (f" ({d.reason})" if d.reason else "")
            for d in self.down
        ]
        return f"{self.model_id} has no serving runner: " + "; ".join(parts) + "; retry once it is re-placed or restarted"


def _first_down(state: State, instance: Instance) -> RunnerDown | None:
    for shard in instance.shards:
        status = state.runners.get(shard.runner_id)
        if status is not None and status.state in DOWN_RUNNER_STATES:
            return RunnerDown(instance.instance_id, shard.runner_id, shard.node_id, status.state, status.error_message)
    return None


def runner_serving(status: RunnerStatus | None) -> bool:
    """Does a runner with this status take requests? (None: not reported yet, so no.)"""
    return status is not None and status.state in SERVING_RUNNER_STATES


def serving(state: State, instance: Instance) -> bool:
    """Is `instance` serving: has every one of its runners reported a serving state? The one
    answer the API (which instance to prefer), the master (which to bind a task to, whether a
    failed download still matters) and this module's verdicts all use."""
    return all(runner_serving(state.runners.get(r)) for r in instance.runner_ids())


def model_serving(state: State, model_id: str) -> ModelServing:
    """Classify every placed instance of `model_id`: serving, loading, or down."""
    serving_now: list[Instance] = []
    loading: list[Instance] = []
    down: list[RunnerDown] = []
    for instance in sorted(state.instances.values(), key=lambda i: i.instance_id):
        if instance.model_id != model_id:
            continue
        if serving(state, instance):
            serving_now.append(instance)
        elif (broken := _first_down(state, instance)) is not None:
            down.append(broken)
        else:
            loading.append(instance)
    return ModelServing(model_id, tuple(serving_now), tuple(loading), tuple(down))


def wait_explanation(state: State, command_id: str) -> str | None:
    """Why the request `command_id` is still waiting for its first frame, for the error it
    ends with at its deadline: the state of each runner of the instance it was bound to (a
    load in progress, a download pending), or that the cluster never logged it."""
    task = next((t for t in state.tasks.values() if getattr(t, "command_id", None) == command_id), None)
    if task is None:
        return "the cluster never logged this request (its command was lost)"
    instance = state.instances.get(task.instance_id)
    if instance is None:
        return f"its instance {task.instance_id} is gone"
    parts: list[str] = []
    for shard in instance.shards:
        status = state.runners.get(shard.runner_id)
        download = state.downloads.get(shard.node_id, {}).get(instance.model_id)
        fetching = " (its download is still pending)" if download is not None and download.type == "DownloadStatusPending" else ""
        described = status.state if status is not None else "not started yet"
        parts.append(f"runner {shard.runner_id} on node {shard.node_id} is {described}{fetching}")
    return "; ".join(parts)


__all__ = [
    "DOWN_RUNNER_STATES",
    "SERVING_RUNNER_STATES",
    "ModelServing",
    "RunnerDown",
    "model_serving",
    "runner_serving",
    "serving",
    "wait_explanation",
]
