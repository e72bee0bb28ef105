"""Data-plane output: what a runner streams back to the API node that owns a command.

One stream per command: `StreamStarted` (seq 0), then ordered `StreamPayload` frames, then
exactly one `StreamTerminal`. The owning API validates that lifecycle; an omitted terminal
becomes a typed failure there. These frames are never indexed by the master or put in
State, so they may be large and frequent, but they are still strict wire models.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, TypeAdapter, model_validator

from skulk.shared.types.base import WireModel
from skulk.shared.types.common import FinishReason, FiniteFloat, NonNegInt, ToolCall, Usage
from skulk.shared.types.ids import CommandId, RunnerId
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.workload_io import WorkloadResult

LOGPROB_FLOOR = -9999.0
"""Engines report log(0) as -inf, which JSON cannot carry; it is clamped to this floor
(exp(-9999) is 0 in float64, so no caller can tell the difference)."""


def _clamp_logprob(value: object) -> object:
    # Only -inf is meaningful (log of a zero probability); NaN and +inf stay errors.
    if isinstance(value, float) and value == -math.inf:
        return LOGPROB_FLOOR
    return value


Logprob = Annotated[FiniteFloat, BeforeValidator(_clamp_logprob)]


class TopLogprob(WireModel):
    token: str
    logprob: Logprob
    token_id: int | None = None


class PromptTokenLogprob(WireModel):
    """One prompt token, scored: its logprob given the tokens before it (None for a first
    token that nothing precedes) and the most likely alternatives there."""

    token: str
    token_id: int
    logprob: Logprob | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class TokenChunk(WireModel):
    type: Literal["TokenChunk"] = "TokenChunk"
    command_id: CommandId
    text: str
    token_id: int | None = None
    logprob: Logprob | None = None
    top_logprobs: list[TopLogprob] | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning: bool = False
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    stop_sequence: str | None = None
    """On the last chunk: the request's stop string that ended it (the text omits it)."""
    prompt_tokens: int | None = None
    """On the first chunk: the prompt's length in tokens."""
    prompt_logprobs: list[PromptTokenLogprob] | None = None
    """On the first chunk, when the request asked (`prompt_logprobs`): the prompt scored."""


class ResultChunk(WireModel):
    """A one-result workload's answer (`skulk.shared.types.workload_io`): its stream's only
    payload."""

    type: Literal["ResultChunk"] = "ResultChunk"
    command_id: CommandId
    result: WorkloadResult
    usage: Usage | None = None


class ErrorChunk(WireModel):
    type: Literal["ErrorChunk"] = "ErrorChunk"
    command_id: CommandId
    error_type: str
    message: str


Chunk = Annotated[
    TokenChunk | ResultChunk | ErrorChunk,
    Field(discriminator="type"),
]
CHUNK_ADAPTER: TypeAdapter[Chunk] = TypeAdapter(Chunk)


class StreamStarted(WireModel):
    type: Literal["StreamStarted"] = "StreamStarted"
    command_id: CommandId
    runner_id: RunnerId
    seq: Literal[0] = 0


class StreamPayload(WireModel):
    type: Literal["StreamPayload"] = "StreamPayload"
    command_id: CommandId
    seq: int = Field(ge=1)
    chunk: Chunk

    @model_validator(mode="after")
    def _same_command(self) -> StreamPayload:
        if self.chunk.command_id != self.command_id:
            raise ValueError(
                f"payload for {self.command_id} carries a chunk for {self.chunk.command_id}"
            )
        return self


StreamOutcome = Literal["completed", "failed", "cancelled"]


class StreamTerminal(WireModel):
    type: Literal["StreamTerminal"] = "StreamTerminal"
    command_id: CommandId
    seq: NonNegInt
    outcome: StreamOutcome
    error_type: StreamErrorType | str | None = None
    error_message: str | None = None

    @model_validator(mode="after")
    def _failure_is_explained(self) -> StreamTerminal:
        if self.outcome == "failed" and not self.error_type:
            raise ValueError("a failed stream terminal needs an error_type")
        return self


DataFrame = Annotated[
    StreamStarted | StreamPayload | StreamTerminal,
    Field(discriminator="type"),
]
DATA_FRAME_ADAPTER: TypeAdapter[DataFrame] = TypeAdapter(DataFrame)

__all__ = [
    "CHUNK_ADAPTER",
    "DATA_FRAME_ADAPTER",
    "LOGPROB_FLOOR",
    "Chunk",
    "DataFrame",
    "ErrorChunk",
    "Logprob",
    "ResultChunk",
    "StreamOutcome",
    "StreamPayload",
    "StreamStarted",
    "StreamTerminal",
    "TokenChunk",
    "TopLogprob",
]
