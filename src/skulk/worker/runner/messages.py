"""The typed IPC between a worker (parent) and one runner subprocess (child).

Both directions carry pydantic `WireModel`s tagged on `type`, pickled through bounded
`multiprocessing` queues. Nothing here may hold a handle, a lock or a clock: these are
messages, and the only place they are interpreted is `bootstrap` (child) and `supervisor`
(parent).

Parent -> runner: `LoadShard` (once, first), then any number of `Generate` / `Cancel`, then
`ShutdownRunner`.

Runner -> parent, per task always in this order (other tasks' messages and StatusChanged
may interleave between them):
    TaskAccepted
    Frame(StreamStarted seq 0)
    Frame(StreamPayload seq 1..n)    each carrying one TokenChunk
    Frame(StreamTerminal seq n+1)    outcome completed | failed | cancelled
    TaskDone                         same outcome as the terminal
A Generate the runner refuses (its dispatch queue is full: RunnerBusy; it is shutting down:
RunnerShutdown) gets no TaskAccepted but still a started frame, a failed terminal and a
TaskDone, so no client stream ever hangs. A second Generate with a task id already in flight
is dropped (and logged): answering it would corrupt the live stream of that command.
When the runner process dies, the parent's supervisor sends what the runner could not (see
`supervisor`), so the per-task order above holds whatever happens.
`StatusChanged` is sent on every change of (state, in_flight): Loading, Loaded, WarmingUp,
Ready, then Running while anything is in flight and Ready when it drains, ShuttingDown on
the way out, Failed (with a reason) when loading fails.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, TypeAdapter

from skulk.shared.types.base import WireModel
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.chunks import DataFrame, StreamOutcome
from skulk.shared.types.common import NonNegInt
from skulk.shared.types.ids import NodeId, RunnerId, TaskId
from skulk.shared.types.instances import Instance, RunnerStatus
from skulk.shared.types.tasks import TextGeneration

# ---------------------------------------------------------------------------------------
# Parent -> runner
# ---------------------------------------------------------------------------------------


class LoadShard(WireModel):
    """Load this runner's shard of `instance`. Always the first message a runner receives."""

    type: Literal["LoadShard"] = "LoadShard"
    instance: Instance
    runner_id: RunnerId
    card: ModelCard
    model_path: str
    """Local path of the artifact: the .gguf file for llama.cpp, the model directory for MLX."""
    n_threads: int | None = Field(default=None, ge=1)
    """CPU threads for the engine; None = the node's physical core count."""


class Generate(WireModel):
    type: Literal["Generate"] = "Generate"
    task: TextGeneration


class Cancel(WireModel):
    """Stop a task. Safe at any time: before it starts, while it runs, after it finished."""

    type: Literal["Cancel"] = "Cancel"
    task_id: TaskId


class ShutdownRunner(WireModel):
    """Finish: in-flight tasks end failed (RunnerShutdown), the engine is freed, exit 0."""

    type: Literal["ShutdownRunner"] = "ShutdownRunner"


ToRunner = Annotated[
    Union[LoadShard, Generate, Cancel, ShutdownRunner],
    Field(discriminator="type"),
]
TO_RUNNER_ADAPTER: TypeAdapter[ToRunner] = TypeAdapter(ToRunner)

# ---------------------------------------------------------------------------------------
# Runner -> parent
# ---------------------------------------------------------------------------------------


class StatusChanged(WireModel):
    type: Literal["StatusChanged"] = "StatusChanged"
    status: RunnerStatus
    in_flight: NonNegInt = 0
    """Tasks admitted and not yet done (queued plus running) when the status was taken."""


class TaskAccepted(WireModel):
    type: Literal["TaskAccepted"] = "TaskAccepted"
    task_id: TaskId


class Frame(WireModel):
    """One data-plane frame for the API node that owns the command (`owner_node_id`)."""

    type: Literal["Frame"] = "Frame"
    owner_node_id: NodeId
    frame: DataFrame


TaskOutcome = StreamOutcome
"""completed | failed | cancelled: a task ends exactly as its stream's terminal says."""


class TaskDone(WireModel):
    type: Literal["TaskDone"] = "TaskDone"
    task_id: TaskId
    outcome: TaskOutcome
    error_message: str | None = None


FromRunner = Annotated[
    Union[StatusChanged, TaskAccepted, Frame, TaskDone],
    Field(discriminator="type"),
]
FROM_RUNNER_ADAPTER: TypeAdapter[FromRunner] = TypeAdapter(FromRunner)

__all__ = [
    "FROM_RUNNER_ADAPTER",
    "TO_RUNNER_ADAPTER",
    "Cancel",
    "Frame",
    "FromRunner",
    "Generate",
    "LoadShard",
    "ShutdownRunner",
    "StatusChanged",
    "TaskAccepted",
    "TaskDone",
    "TaskOutcome",
    "ToRunner",
]
