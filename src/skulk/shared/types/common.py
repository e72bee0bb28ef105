"""Small vocabulary shared by events, commands, tasks, chunks and state.

Status words are `Literal` strings, not `enum.Enum`: they appear verbatim on the wire, in
JSON and in the dashboard, and a Literal compares equal to the plain string a peer sent.
This module holds only types and their invariants; it must never do I/O or read the clock.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, Field, model_validator

from skulk.shared.types.base import WireModel
from skulk.shared.types.ids import NodeId
from skulk.shared.types.media import ImageInput


def _as_utc(value: datetime) -> datetime:
    # Normalising every tz to `timezone.utc` makes the ISO form (and so canonical bytes and
    # state hashes) identical however the producer spelled the offset.
    return value.astimezone(UTC)


UtcDatetime = Annotated[AwareDatetime, AfterValidator(_as_utc)]
"""A timezone-aware datetime, normalised to UTC. Naive datetimes are rejected; ISO strings
(what msgpack and JSON carry) are accepted when decoding."""


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number (NaN/inf cannot cross the JSON wire)")
    return value


FiniteFloat = Annotated[float, AfterValidator(_finite)]
"""A float that survives JSON: pydantic's JSON mode turns NaN/inf into null, which would not
decode back, so they are refused at construction instead of at the far end."""

NonNegInt = Annotated[int, Field(ge=0)]

Sharding = Literal["Pipeline", "Tensor"]

RunnerState = Literal[
    "Idle",
    "Connecting",
    "Connected",
    "Loading",
    "Loaded",
    "WarmingUp",
    "Ready",
    "Running",
    "ShuttingDown",
    "Shutdown",
    "Failed",
]

TaskStatus = Literal["Pending", "Running", "Complete", "Failed", "Cancelled"]

TERMINAL_TASK_STATUSES: frozenset[str] = frozenset({"Complete", "Failed", "Cancelled"})
"""Once a task reaches one of these, the reducer ignores later status changes to it."""

FinishReason = Literal["stop", "length", "tool_calls", "error", "cancelled"]


class ToolCall(WireModel):
    """A tool invocation produced by the model; `arguments` is the JSON text as generated."""

    id: str
    name: str
    arguments: str


class ToolSpec(WireModel):
    """A tool the caller offers; `parameters` is its JSON schema, passed through untouched."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    strict: bool = False
    """Every call of it must match `parameters` (OpenAI's and Anthropic's `strict`): forced
    calls are grammar-constrained, chosen ones checked and generated again when they break
    it (`skulk.api.strict_tools`)."""


ChatRole = Literal["system", "user", "assistant", "tool"]


class ChatMessage(WireModel):
    role: ChatRole
    content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    """An assistant turn's reasoning, as the client sends it back (Anthropic thinking blocks,
    OpenAI's `reasoning_content`, Ollama's `thinking`); the chat template decides whether
    it is shown to the model again (most show only the latest turn's)."""
    images: list[ImageInput] = Field(default_factory=list)
    """The message's images, in order, each standing where `IMAGE_MARKER` is in `content`
    (`skulk.shared.types.media`). Never in State: `TextGenerationParams.redacted` drops them."""


class Usage(WireModel):
    prompt_tokens: NonNegInt = 0
    completion_tokens: NonNegInt = 0
    total_tokens: NonNegInt = 0
    cached_tokens: NonNegInt = 0
    """Prompt tokens whose KV was re-used from a cached prefix instead of evaluated
    (OpenAI `prompt_tokens_details.cached_tokens`, Anthropic `cache_read_input_tokens`)."""
    drafted_tokens: NonNegInt = 0
    """Tokens a speculative drafter proposed (`skulk.shared.types.speculative`); the target
    model checked each, so the output is the same as without drafting."""
    accepted_draft_tokens: NonNegInt = 0
    """Drafted tokens the target model accepted (OpenAI
    `completion_tokens_details.accepted_prediction_tokens`)."""


InterfaceKind = Literal["thunderbolt", "ethernet", "wifi", "loopback", "overlay", "other"]


class NetworkInterface(WireModel):
    name: str
    addresses: list[str] = Field(default_factory=list)
    kind: InterfaceKind = "other"


EdgeKind = Literal["session", "probed"]


class Edge(WireModel):
    """A directed connectivity fact: `source` reached `sink` (a live fabric session or a
    verified probe of `address`). Either end may be a node that has not joined yet."""

    source: NodeId
    sink: NodeId
    kind: EdgeKind
    address: str | None = None

    @model_validator(mode="after")
    def _no_self_loop(self) -> Edge:
        if self.source == self.sink:
            raise ValueError(f"edge from {self.source} to itself")
        return self

    if TYPE_CHECKING:
        # Frozen (WireModel's config), so pydantic gives it a field hash; the checker reads
        # only class-keyword `frozen=True`, so it is told here. Membership keeps edges in sets.
        def __hash__(self) -> int: ...

    def sort_key(self) -> tuple[str, str, str, bool, str]:
        """Total order used to keep `State.edges` canonical (None sorts before any address)."""
        return (self.source, self.sink, self.kind, self.address is not None, self.address or "")

    def touches(self, node_id: NodeId) -> bool:
        return self.source == node_id or self.sink == node_id


def canonical_edges(edges: list[Edge] | tuple[Edge, ...] | set[Edge]) -> list[Edge]:
    """Sorted, duplicate-free edges: the only form `State.edges` may hold."""
    return sorted(set(edges), key=Edge.sort_key)


__all__ = [
    "TERMINAL_TASK_STATUSES",
    "ChatMessage",
    "Edge",
    "EdgeKind",
    "FinishReason",
    "FiniteFloat",
    "InterfaceKind",
    "NetworkInterface",
    "NonNegInt",
    "RunnerState",
    "Sharding",
    "TaskStatus",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "UtcDatetime",
    "canonical_edges",
]
