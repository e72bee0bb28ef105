"""Tasks: units of work the master assigns to a worker and its runners.

Every task (`TextGeneration`, `WorkloadTask`) carries a caller's request to an instance's rank
0; runners move through their states by the worker's own plan, not by tasks. Tasks live in
State, so everything here must be deterministic data, never handles or clocks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter, model_validator

from skulk.shared.types.base import WireModel
from skulk.shared.types.common import ChatMessage, FiniteFloat, TaskStatus, ToolSpec
from skulk.shared.types.ids import CommandId, InstanceId, ModelId, NodeId, TaskId
from skulk.shared.types.stream_errors import StreamErrorType
from skulk.shared.types.workload_io import EmbeddingParams, OneResultParams


class ResponseFormat(WireModel):
    """Structured output: `json_object` (the output is one JSON object) or `json_schema`
    (one JSON value valid for `json_schema`), enforced by constrained decoding."""

    type: Literal["json_object", "json_schema"]
    name: str = "response"
    json_schema: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _schema_for_json_schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("`json_schema` is required for type 'json_schema' and only for it")
        return self


class TextGenerationParams(WireModel):
    """A normalised generation request: either chat `messages` (rendered with the model's
    chat template) or a raw completion `prompt`, never both."""

    workload: Literal["text"] = "text"
    model_id: ModelId
    messages: list[ChatMessage] = Field(default_factory=list)
    prompt: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: FiniteFloat | None = Field(default=None, ge=0)
    top_p: FiniteFloat | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    thinking: bool | None = None
    """Turn the model's reasoning on or off through its chat template's switch (None: the
    template's default). The API refuses it for a model whose card has no switch."""
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    """A reasoning level, for templates that take one (gpt-oss's `reasoning_effort`)."""
    thinking_budget: int | None = Field(default=None, ge=1)
    """The most tokens the reasoning may take (Anthropic's `thinking.budget_tokens`). The API
    holds it (`skulk.api.thinking_budget`): reasoning still open at the budget is closed
    there and the model answers in a continuation. Engines never read it."""
    continue_from: str | None = None
    """Text the assistant turn starts with, written right after the chat template's
    generation prompt and continued from: the model's own reasoning so far and the marker
    that closes it (a spent thinking budget). Special-token text in it is parsed: it is
    the model's output and the card's marker, not caller text. Chat requests only."""
    min_p: FiniteFloat | None = Field(default=None, ge=0, le=1)
    """Drop tokens less likely than min_p x the most likely one's probability (None: the
    engine's default: 0.05 on llama.cpp, 0 on MLX and vLLM)."""
    seed: int | None = None
    speculative: bool | None = None
    """Whether the caller wants this request drafted (`skulk.shared.types.speculative`; None:
    as the model is placed). The engines that draft fix it when they start, so the API
    refuses a value the placed model is not served with (`request_refusal`); engines never
    read it."""
    stop: list[str] = Field(default_factory=list)
    tools: list[ToolSpec] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    prompt_logprobs: bool = False
    """Score the prompt's tokens too (legacy completions' `echo` with `logprobs`): the first
    chunk carries each prompt token's logprob and `top_logprobs` alternatives."""
    stream: bool = False
    response_format: ResponseFormat | None = None
    frequency_penalty: FiniteFloat | None = Field(default=None, ge=-2, le=2)
    presence_penalty: FiniteFloat | None = Field(default=None, ge=-2, le=2)
    repeat_penalty: FiniteFloat | None = Field(default=None, gt=0)
    """Multiplicative penalty on tokens seen recently (llama.cpp's and Ollama's knob)."""
    logit_bias: dict[int, FiniteFloat] = Field(default_factory=dict)
    """Token id -> bias added to its logit before sampling (OpenAI: -100 bans, 100 forces)."""
    context_tokens: int | None = Field(default=None, ge=1)
    """A tighter context for this request than the instance's (Ollama's `num_ctx`): the
    prompt plus the output must fit in it."""
    keep_alive_s: FiniteFloat | None = Field(default=None, ge=-1)
    """How long the runner stays loaded once idle after this request (Ollama's
    `keep_alive`; -1: never unload), overriding the placement's `idleTtl` from now on
    (`skulk.shared.residency`)."""
    count_only: bool = False
    """Count the prompt's tokens and generate nothing (Anthropic's count_tokens): the answer
    is one empty chunk whose usage holds the count."""

    @model_validator(mode="after")
    def _one_input(self) -> TextGenerationParams:
        if (self.prompt is None) == (not self.messages):
            raise ValueError("exactly one of `messages` (non-empty) or `prompt` is required")
        if self.continue_from is not None and self.prompt is not None:
            raise ValueError("`continue_from` continues a chat turn; a raw `prompt` is continued by extending it")
        return self

    def redacted(self) -> TextGenerationParams:
        """These params without any caller text, for State (`skulk.shared.types.task_inputs`):
        message contents, tool calls and names, the raw prompt, tool definitions, stop strings
        and a response schema are emptied; roles, counts and sampling stay (the master and
        the operator views need nothing more)."""
        return self.model_copy(update={
            "messages": [ChatMessage(role=m.role, content="" if m.content is not None else None)
                         for m in self.messages],
            "prompt": "" if self.prompt is not None else None,
            "continue_from": "" if self.continue_from is not None else None,
            "tools": [],
            "stop": [],
            "response_format": None if self.response_format is None else self.response_format.model_copy(
                update={"json_schema": {} if self.response_format.json_schema is not None else None}),
        })


class _TaskBase(WireModel):
    task_id: TaskId
    instance_id: InstanceId
    status: TaskStatus = "Pending"
    error_type: StreamErrorType | str | None = None
    """Why the master failed the task (TaskFailed's error type), so the owning API node can
    tell its client node loss from a refused placement; None while the task is not failed."""
    error_message: str | None = None


class TextGeneration(_TaskBase):
    type: Literal["TextGeneration"] = "TextGeneration"
    command_id: CommandId
    owner_node_id: NodeId
    """The node whose API holds the client's request: output streams go there."""
    params: TextGenerationParams
    traced: bool = False
    """Copied from `GenerateText.traced`: the worker and runner record spans for it."""


class WorkloadTask(_TaskBase):
    """A one-result workload's task (embeddings, echo: `skulk.shared.types.workload_io`)."""

    type: Literal["WorkloadTask"] = "WorkloadTask"
    command_id: CommandId
    owner_node_id: NodeId
    params: OneResultParams


ApiTask = TextGeneration | WorkloadTask
"""Tasks that answer a caller's command; they own a data-plane stream."""

Task = Annotated[TextGeneration | WorkloadTask, Field(discriminator="type")]

WorkloadParams = Annotated[TextGenerationParams | OneResultParams, Field(discriminator="workload")]
"""Any workload's params, told apart by their `workload` tag (a task input carries one)."""

TASK_ADAPTER: TypeAdapter[Task] = TypeAdapter(Task)

__all__ = [
    "TASK_ADAPTER",
    "ApiTask",
    "EmbeddingParams",
    "ResponseFormat",
    "Task",
    "TextGeneration",
    "TextGenerationParams",
    "WorkloadParams",
    "WorkloadTask",
]
