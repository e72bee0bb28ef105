"""A request's text, kept out of the cluster's State and event log.

The master needs a task's metadata (which model, which instance, how many tokens, who owns
the stream), never its text: prompts and outputs must not be written into the master's
event log or shown by `/state`. So the API node submits `GenerateText`/`Embed` with
*redacted* params (`redacted_generation_params`, `redacted_embedding_params`: every piece
of caller text emptied, the shape kept), and sends the full params as a `TaskInput` over the
data plane to the node that runs the task's rank 0, once the master has bound the task to
an instance (`skulk.cluster.task_inputs`). The worker dispatches a task only when its input
has arrived (`skulk.worker.plan.dispatch_pending_tasks`).
"""

from __future__ import annotations

from pydantic import model_validator

from skulk.shared.types.base import WireModel
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.ids import CommandId
from skulk.shared.types.tasks import EmbeddingParams, TextGenerationParams


class TaskInput(WireModel):
    """The full params of one command, addressed to the node that runs it."""

    command_id: CommandId
    generation: TextGenerationParams | None = None
    embedding: EmbeddingParams | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> TaskInput:
        if (self.generation is None) == (self.embedding is None):
            raise ValueError("exactly one of `generation` or `embedding` is required")
        return self

    @property
    def params(self) -> TextGenerationParams | EmbeddingParams:
        return self.generation if self.generation is not None else self.embedding  # type: ignore[return-value]


def _redacted_message(message: ChatMessage) -> ChatMessage:
    return ChatMessage(role=message.role, content="" if message.content is not None else None)


def redacted_generation_params(params: TextGenerationParams) -> TextGenerationParams:
    """`params` without any caller text: message contents, tool calls and names, the raw
    prompt, tool definitions and stop strings are emptied; roles, counts and sampling stay
    (the master and the operator views need nothing more)."""
    return params.model_copy(update={
        "messages": [_redacted_message(m) for m in params.messages],
        "prompt": "" if params.prompt is not None else None,
        "tools": [],
        "stop": [],
        # A response schema is the caller's text too: only its kind stays.
        "response_format": None if params.response_format is None else params.response_format.model_copy(
            update={"json_schema": {} if params.response_format.json_schema is not None else None}),
    })


def redacted_embedding_params(params: EmbeddingParams) -> EmbeddingParams:
    """`params` without the texts or token ids to embed (their count stays)."""
    return params.model_copy(update={
        "inputs": ["" for _ in params.inputs],
        "token_inputs": [[0] for _ in params.token_inputs],
    })


__all__ = ["TaskInput", "redacted_embedding_params", "redacted_generation_params"]
