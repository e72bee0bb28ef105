"""The typed IPC between a worker (parent) and one runner subprocess (child).

Both directions carry pydantic `WireModel`s tagged on `type`. Parent -> runner messages are
rare and go through a bounded `multiprocessing` queue. Runner -> parent messages include one
frame per generated token, so they travel as length-prefixed bytes over a pipe written
directly by the thread that produced them (`pack` / `unpack`): a token frame is a flat tuple
of primitives, never a pickled model tree, and no feeder thread sits in between. Nothing here
may hold a handle, a lock or a clock: these are messages, and the only place they are
interpreted is `bootstrap` (child) and `supervisor` (parent).

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

import pickle
from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from skulk.shared.types.base import WireModel
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.chunks import DataFrame, StreamOutcome, StreamPayload, TokenChunk
from skulk.shared.types.common import FinishReason, NonNegInt, Usage
from skulk.shared.types.ids import NodeId, RunnerId, TaskId
from skulk.shared.types.instances import Instance, RunnerStatus
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.tasks import TextGeneration, WorkloadTask
from skulk.shared.types.traces import TraceSpan

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
    draft_model_path: str | None = None
    """Local path of the draft (a GGUF file, or an MLX model directory:
    `skulk.models.companions.draft_model_path`) for a card
    that speculates with one; None otherwise."""
    projector_path: str | None = None
    """Local path of the multimodal projector (`skulk.models.companions.projector_path`) for
    a card that sees images; None otherwise."""
    n_threads: int | None = Field(default=None, ge=1)
    """CPU threads for the engine; None = the node's physical core count."""
    pool_key: str | None = Field(default=None, repr=False)
    """Hex of the cluster's llama.cpp pool channel secret (`skulk.pool.layout`), for a
    pooled instance's ranks. Travels only over the runner's local pipe."""


class Generate(WireModel):
    """Run one API task: a text generation (token frames) or a one-result workload (one
    ResultChunk frame)."""

    type: Literal["Generate"] = "Generate"
    task: Annotated[TextGeneration | WorkloadTask, Field(discriminator="type")]


class Cancel(WireModel):
    """Stop a task. Safe at any time: before it starts, while it runs, after it finished."""

    type: Literal["Cancel"] = "Cancel"
    task_id: TaskId


class ShutdownRunner(WireModel):
    """Finish: in-flight tasks end failed (RunnerShutdown), the engine is freed, exit 0."""

    type: Literal["ShutdownRunner"] = "ShutdownRunner"


ToRunner = Annotated[
    LoadShard | Generate | Cancel | ShutdownRunner,
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
    resident: bool = True
    """The model is loaded; False while a Ready runner has unloaded it for being idle past
    its TTL (`skulk.shared.residency`): the next request reloads it first."""


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
    error_type: StreamErrorType | str | None = None
    """On a failure: the same typed cause as the task's failed StreamTerminal. The worker puts
    it on the TaskStatusUpdated, so a client whose API node learns of the failure from State
    before the terminal frame arrives still gets the specific cause (RunnerCrashed, ...)."""


class TraceSpans(WireModel):
    """The runner's spans of one traced task (`TextGeneration.traced`), sent once, before its
    terminal frame, for the runner's node to keep with the trace (`command_id`)."""

    type: Literal["TraceSpans"] = "TraceSpans"
    command_id: str
    spans: list[TraceSpan]


FromRunner = Annotated[
    StatusChanged | TaskAccepted | Frame | TaskDone | TraceSpans,
    Field(discriminator="type"),
]
FROM_RUNNER_ADAPTER: TypeAdapter[FromRunner] = TypeAdapter(FromRunner)

# ---------------------------------------------------------------------------------------
# Runner -> parent byte encoding
# ---------------------------------------------------------------------------------------

_PLAIN_TOKEN = 0
_MESSAGE = 1
_PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL


def pack_token(
    owner_node_id: str,
    command_id: str,
    seq: int,
    text: str,
    token_id: int | None,
    finish_reason: FinishReason | None = None,
    usage: Usage | None = None,
) -> bytes:
    """The bytes of `Frame(StreamPayload(TokenChunk))` for a token with nothing but text, id,
    finish reason and usage: the per-token hot path, a few microseconds instead of building
    and pickling three models. `unpack` rebuilds the same `Frame`."""
    counts = None if usage is None else (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens,
                                         usage.cached_tokens, usage.drafted_tokens, usage.accepted_draft_tokens)
    return pickle.dumps(
        (_PLAIN_TOKEN, owner_node_id, command_id, seq, text, token_id, finish_reason, counts), _PICKLE_PROTOCOL
    )


def pack(message: FromRunner) -> bytes:
    """Any runner -> parent message as bytes (token frames with extras, status, lifecycle)."""
    return pickle.dumps((_MESSAGE, message), _PICKLE_PROTOCOL)


class _Trusted:
    """Builds one model class from trusted values without validation, like `model_construct`,
    at a fifth of its cost: the fields it is not given come from a dict of the class's
    defaults made once, not from walking every field per call. The three models of a token
    frame took ~13 us per token in the supervisor through `model_construct`, the largest
    share of a served engine's per-token path (bench/served_token_path.py); ~3 us this way.
    It sets exactly what `model_construct` sets (`__dict__`, the fields set, no extra, no
    private state); only for models without private attributes or mutable defaults."""

    def __init__(self, cls: Any, **placeholders: Any) -> None:
        self._cls = cls
        self._defaults = dict(cls.model_construct(**placeholders).__dict__)

    def __call__(self, **values: Any) -> Any:
        model = object.__new__(self._cls)
        fields = self._defaults.copy()
        fields.update(values)
        object.__setattr__(model, "__dict__", fields)
        object.__setattr__(model, "__pydantic_fields_set__", set(values))
        object.__setattr__(model, "__pydantic_extra__", None)
        object.__setattr__(model, "__pydantic_private__", None)
        return model


_token_chunk = _Trusted(TokenChunk, command_id="", text="")
_stream_payload = _Trusted(StreamPayload, command_id="", seq=1, chunk=None)
_frame = _Trusted(Frame, owner_node_id="", frame=None)


def unpack(data: bytes | bytearray) -> FromRunner:
    """The message `pack` or `pack_token` encoded. Token frames are rebuilt without
    re-validation: the runner built them from its own typed values, and the parent trusts
    its own child exactly as far as it trusts a pickle from it."""
    record: Any = pickle.loads(data)
    if record[0] == _MESSAGE:
        return record[1]
    _, owner, command_id, seq, text, token_id, finish_reason, counts = record
    usage = None
    if counts is not None:
        usage = Usage.model_construct(prompt_tokens=counts[0], completion_tokens=counts[1], total_tokens=counts[2],
                                      cached_tokens=counts[3], drafted_tokens=counts[4],
                                      accepted_draft_tokens=counts[5])
    chunk = _token_chunk(command_id=command_id, text=text, token_id=token_id, finish_reason=finish_reason, usage=usage)
    return _frame(owner_node_id=owner, frame=_stream_payload(command_id=command_id, seq=seq, chunk=chunk))


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
    "TraceSpans",
    "pack",
    "pack_token",
    "unpack",
]
