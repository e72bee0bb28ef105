"""The Anthropic Messages wire format (`POST /v1/messages`), both ways.

Incoming: `MessagesRequest` (what the Anthropic SDK sends; unknown fields such as
`metadata` are ignored) and `to_params`, which normalises it into the internal
`TextGenerationParams` or raises `InvalidRequest` naming the parameter to fix. Outgoing:
`MessageStreamEncoder` turns token chunks into Anthropic's named SSE events
(message_start, content_block_start, ping, content_block_delta*, content_block_stop,
message_delta, message_stop) and `collect_message` builds the non-streaming `message`.

Tools: `tools` (name, description, input_schema) and `tool_choice` are normalised to the
internal tool specs; `tool_use` blocks in assistant turns become the turn's tool calls and
`tool_result` blocks in user turns become tool messages, so the model's chat template sees
the whole exchange. Output tool calls leave as `tool_use` blocks (stop_reason "tool_use")
and reasoning as `thinking` blocks. A forcing `tool_choice` ("any", or "tool" with a name) is
decoded under a grammar on the engine, and a forced tool whose `input_schema` no grammar can
enforce is refused with a 400 naming it. `image` blocks in user turns (base64 or url sources)
become the message's images (`skulk.api.media`; the declared `media_type` is not trusted:
the bytes are sniffed); documents are refused with a 400 naming the block; `thinking` blocks sent back by a client reach the template as the turn's reasoning.
The request's `thinking` setting turns the model's reasoning on or off through its template
(`skulk.shared.reasoning_switches`), or is refused by name when the model cannot.

Pure translation only: this module must never touch streams, commands or the cluster.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, ValidationError

from skulk.api import media
from skulk.api.errors import ApiError, InvalidRequest, anthropic_error_body, invalid_request_from_validation
from skulk.api.strict_tools import check_strict_schemas
from skulk.api.tool_calls import check_enforceable
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.common import ChatMessage, ChatRole, ToolCall, ToolSpec, Usage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.media import IMAGE_MARKER, ImageInput
from skulk.shared.types.tasks import TextGenerationParams

MESSAGE_ID_PREFIX = "msg_"
"""Message ids are this prefix plus the command id."""

MIN_TOP_P = 1e-6
"""`top_p: 0` keeps only the most likely token; the internal params need a positive nucleus."""

_ROLES = frozenset({"user", "assistant"})

# ---------------------------------------------------------------------------------------
# Request
# ---------------------------------------------------------------------------------------


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Lenient):
    type: str
    text: str | None = None


class ImageSource(_Lenient):
    """An `image` block's source: `{"type": "base64", "media_type", "data"}` or
    `{"type": "url", "url"}` (fetched by the API node, `skulk.api.image_fetch`)."""

    type: str
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


class ContentBlock(_Lenient):
    """One content block: `text`, `image`, `tool_use`, `tool_result` or `thinking`. Other
    types are accepted by the schema so that `to_params` can name them in a clear 400."""

    type: str
    text: str | None = None
    thinking: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: str | list[TextBlock] | None = None
    is_error: bool | None = None
    source: ImageSource | None = None


class InputMessage(_Lenient):
    role: str
    content: str | list[ContentBlock]


class ToolDefinition(_Lenient):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    strict: bool | None = None
    """Anthropic's strict tool use: every call matches input_schema."""
    type: str | None = None
    """Set only on Anthropic's server tools (web search, ...), which Skulk cannot run."""


class ToolChoice(_Lenient):
    type: str
    name: str | None = None


class ThinkingConfig(_Lenient):
    """Anthropic's extended-thinking switch: `{"type": "enabled", "budget_tokens": N}`,
    `{"type": "disabled"}` or `{"type": "adaptive"}` (the model decides)."""

    type: str
    budget_tokens: int | None = None


MIN_THINKING_BUDGET = 1024
"""Anthropic's smallest `thinking.budget_tokens`."""


class MessagesRequest(_Lenient):
    """`POST /v1/messages`, as Anthropic documents it. Range rules live in `to_params`."""

    model: str
    messages: list[InputMessage]
    max_tokens: int
    system: str | list[ContentBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = False
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class CountTokensRequest(_Lenient):
    """`POST /v1/messages/count_tokens`: a message request without `max_tokens`."""

    model: str
    messages: list[InputMessage]
    system: str | list[ContentBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


PARAM_NAMES = {"thinking": "thinking.type"}
"""The Anthropic names of internal params, for refusals (`reasoning_switch_unsupported`)."""


def count_params(request: CountTokensRequest, fetched: Mapping[str, bytes] | None = None) -> TextGenerationParams:
    """The count-only generation request for `request`: rendered exactly as the message
    request with the same fields would be, so the count equals that request's input usage."""
    # The thinking budget is checked without max_tokens, which a count has not.
    full = MessagesRequest(**request.model_dump(exclude_none=True, exclude={"thinking"}), max_tokens=1)
    return to_params(full, fetched).model_copy(update={"count_only": True, **_thinking(request.thinking, None)})


def _text(content: str | Sequence[ContentBlock | TextBlock], where: str) -> str:
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for index, block in enumerate(content):
        if block.type != "text":
            raise InvalidRequest(
                f"Content blocks of type {block.type!r} are not supported; only 'text' blocks are.",
                param=f"{where}[{index}].type",
            )
        if block.text is None:
            raise InvalidRequest("A text block needs 'text'.", param=f"{where}[{index}].text")
        texts.append(block.text)
    # Separate blocks are separate passages; a newline keeps their words apart.
    return "\n".join(texts)


def _in_range(value: float | None, low: float, high: float, param: str) -> float | None:
    # A positive range test, so that NaN fails too.
    if value is not None and not (low <= value <= high):
        raise InvalidRequest(f"{param}: must be between {low:g} and {high:g}, got {value}.", param=param)
    return value


def _thinking(config: ThinkingConfig | None, max_tokens: int | None) -> dict[str, Any]:
    """Anthropic's `thinking` as the params' reasoning switch: enabled turns the model's
    reasoning on, disabled off, adaptive leaves the model's own default. The budget is
    checked as Anthropic checks it (at least 1024, below max_tokens) and is a hard cap on the
    reasoning (`skulk.api.thinking_budget`); reasoning and answer together stay within
    max_tokens."""
    if config is None or config.type == "adaptive":
        return {}
    if config.type == "disabled":
        return {"thinking": False}
    if config.type != "enabled":
        raise InvalidRequest(f"thinking.type: unexpected {config.type!r}; expected 'enabled', 'disabled' or "
                             "'adaptive'.", param="thinking.type")
    budget = config.budget_tokens
    if budget is None:
        raise InvalidRequest("thinking.budget_tokens: required when thinking is enabled.",
                             param="thinking.budget_tokens")
    if budget < MIN_THINKING_BUDGET or (max_tokens is not None and budget >= max_tokens):
        below = f" and less than max_tokens ({max_tokens})" if max_tokens is not None else ""
        raise InvalidRequest(f"thinking.budget_tokens: must be at least {MIN_THINKING_BUDGET}{below}, got {budget}.",
                             param="thinking.budget_tokens")
    return {"thinking": True, "thinking_budget": budget}


def _tools(definitions: Sequence[ToolDefinition]) -> list[ToolSpec]:
    tools: list[ToolSpec] = []
    for index, tool in enumerate(definitions):
        if tool.type not in (None, "custom"):
            raise InvalidRequest(
                f"tools[{index}]: server tools ({tool.type!r}) are not supported; define a client tool with "
                "name, description and input_schema.", param=f"tools[{index}].type",
            )
        tools.append(ToolSpec(name=tool.name, description=tool.description or "", strict=bool(tool.strict),
                              parameters=tool.input_schema or {"type": "object"}))
    return tools


def _tool_choice(choice: ToolChoice | None, tools: Sequence[ToolSpec]) -> str | dict[str, Any] | None:
    """Anthropic's tool_choice as the internal (OpenAI-shaped) one."""
    if choice is None:
        return None
    if choice.type in ("auto", "none"):
        return choice.type
    if choice.type in ("any", "tool") and not tools:
        raise InvalidRequest(f"tool_choice: {choice.type!r} needs 'tools'.", param="tool_choice")
    if choice.type == "any":
        return "required"
    if choice.type == "tool":
        if choice.name not in {t.name for t in tools}:
            raise InvalidRequest(f"tool_choice: {choice.name!r} is not among 'tools'.", param="tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    raise InvalidRequest(
        f"tool_choice: unexpected type {choice.type!r}; expected 'auto', 'any', 'tool' or 'none'.",
        param="tool_choice.type",
    )


def image_urls(request: MessagesRequest | CountTokensRequest) -> list[tuple[str, str]]:
    """The http(s) URLs of a request's `image` blocks, each with the field naming it: the
    route fetches them (`skulk.api.image_fetch`) before `to_params`."""
    urls: list[tuple[str, str]] = []
    for index, message in enumerate(request.messages):
        for block_index, block in enumerate(message.content if isinstance(message.content, list) else []):
            source = block.source if block.type == "image" else None
            if source is not None and source.type == "url" and source.url and media.is_fetched_url(source.url):
                urls.append((source.url, f"messages[{index}].content[{block_index}].source.url"))
    return urls


def _image(block: ContentBlock, at: str, fetched: Mapping[str, bytes]) -> ImageInput:
    source = block.source
    if source is None:
        raise InvalidRequest(f"{at}.source: an image block needs a 'source'.", param=f"{at}.source")
    if source.type == "base64":
        if not source.data:
            raise InvalidRequest(f"{at}.source.data: a base64 image source needs 'data'.", param=f"{at}.source.data")
        return media.image_input(media.decode_base64(source.data, f"{at}.source.data"), f"{at}.source.data")
    if source.type == "url":
        if not source.url:
            raise InvalidRequest(f"{at}.source.url: a url image source needs 'url'.", param=f"{at}.source.url")
        return media.image_from_url(source.url, fetched, f"{at}.source.url")
    raise InvalidRequest(f"{at}.source.type: image sources of type {source.type!r} are not supported; send "
                         "'base64' or 'url'.", param=f"{at}.source.type")


def _turn(message: InputMessage, where: str, fetched: Mapping[str, bytes]) -> list[ChatMessage]:
    """One Anthropic turn as chat messages: tool results become tool messages (ahead of the
    turn's text, as they answer the previous turn's calls), tool_use blocks become the
    assistant's tool calls, thinking blocks its reasoning (the template decides whether the
    model sees it again, and count_tokens counts what it renders)."""
    role = cast(ChatRole, message.role)  # to_params checked it against _ROLES
    if isinstance(message.content, str):
        return [ChatMessage(role=role, content=media.check_text(message.content, f"{where}.content"))]
    results: list[ChatMessage] = []
    texts: list[str] = []
    images: list[ImageInput] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for index, block in enumerate(message.content):
        at = f"{where}.content[{index}]"
        if block.type == "redacted_thinking":
            continue  # encrypted by another provider: nothing a template can show
        if block.type == "thinking":
            if message.role == "assistant" and block.thinking:
                thoughts.append(block.thinking)
            continue
        if block.type == "tool_use" and message.role == "assistant":
            if not block.id or not block.name:
                raise InvalidRequest(f"{at}: a tool_use block needs 'id' and 'name'.", param=at)
            arguments = json.dumps(block.input if block.input is not None else {}, ensure_ascii=False)
            calls.append(ToolCall(id=block.id, name=block.name, arguments=arguments))
        elif block.type == "tool_result" and message.role == "user":
            if not block.tool_use_id:
                raise InvalidRequest(f"{at}.tool_use_id: a tool_result needs the id it answers.",
                                     param=f"{at}.tool_use_id")
            content = _text(block.content or "", f"{at}.content")
            results.append(ChatMessage(role="tool", content=content, tool_call_id=block.tool_use_id))
        elif block.type == "text":
            if block.text is None:
                raise InvalidRequest(f"{at}.text: a text block needs 'text'.", param=f"{at}.text")
            texts.append(media.check_text(block.text, f"{at}.text") or "")
        elif block.type == "image" and message.role == "user":
            images.append(_image(block, at, fetched))
            texts.append(IMAGE_MARKER)
        else:
            raise InvalidRequest(
                f"{at}.type: content blocks of type {block.type!r} are not supported in a {message.role} turn.",
                param=f"{at}.type",
            )
    turn: list[ChatMessage] = []
    if texts or calls or not results:
        # Separate blocks are separate passages; a newline keeps their words apart.
        turn.append(ChatMessage(role=role, content="\n".join(texts) if texts else None, tool_calls=calls,
                                reasoning_content="\n".join(thoughts) or None, images=images))
    return results + turn


def to_params(request: MessagesRequest, fetched: Mapping[str, bytes] | None = None) -> TextGenerationParams:
    """The internal generation request, or `InvalidRequest` naming the parameter at fault.
    `fetched`: the bodies of its image blocks' http(s) URLs (`image_urls`), as the route
    fetched them."""
    if not request.model.strip():
        raise InvalidRequest("model: must name a model.", param="model")
    if not request.messages:
        raise InvalidRequest("messages: at least one message is required.", param="messages")
    if request.max_tokens < 1:
        raise InvalidRequest(f"max_tokens: must be at least 1, got {request.max_tokens}.", param="max_tokens")
    tools = _tools(request.tools or [])
    tool_choice = _tool_choice(request.tool_choice, tools)
    check_enforceable(tools, tool_choice, lambda index: f"tools[{index}].input_schema")
    check_strict_schemas(tools, lambda index: f"tools[{index}].input_schema")
    temperature = _in_range(request.temperature, 0.0, 1.0, "temperature")
    top_p = _in_range(request.top_p, 0.0, 1.0, "top_p")
    if request.top_k is not None and request.top_k < 0:
        raise InvalidRequest(f"top_k: must be at least 0, got {request.top_k}.", param="top_k")
    stops = list(request.stop_sequences or [])
    if any(s == "" for s in stops):
        raise InvalidRequest("stop_sequences: must not contain empty strings.", param="stop_sequences")
    messages: list[ChatMessage] = []
    if request.system is not None:
        system = _text(request.system, "system")
        if system:
            messages.append(ChatMessage(role="system", content=system))
    for index, message in enumerate(request.messages):
        where = f"messages[{index}]"
        if message.role not in _ROLES:
            raise InvalidRequest(
                f"{where}.role: unexpected role {message.role!r}; expected 'user' or 'assistant'.",
                param=f"{where}.role",
            )
        messages.extend(_turn(message, where, fetched or {}))
    try:
        return TextGenerationParams(
            model_id=ModelId(request.model),
            messages=messages,
            max_tokens=request.max_tokens,
            temperature=temperature,
            top_p=None if top_p is None else max(top_p, MIN_TOP_P),
            top_k=request.top_k,
            stop=stops,
            tools=tools,
            tool_choice=tool_choice,
            stream=bool(request.stream),
            **_thinking(request.thinking, request.max_tokens),
        )
    except ValidationError as error:
        raise invalid_request_from_validation(error) from None


# ---------------------------------------------------------------------------------------
# Response pieces
# ---------------------------------------------------------------------------------------


def message_id(command_id: str) -> str:
    return f"{MESSAGE_ID_PREFIX}{command_id}"


def stop_reason(finish_reason: str | None, matched: str | None, stop_sequences: Sequence[str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for how a generation ended: `length` -> max_tokens; a
    stop on one of the request's stop sequences (the engine reports which, as the last
    chunk's `stop_sequence`) -> stop_sequence; anything else -> end_turn."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "stop" and matched is not None and matched in stop_sequences:
        return "stop_sequence", matched
    return "end_turn", None


NO_CACHE_USAGE = {"cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
"""Anthropic's prompt-cache counters before anything is known: both 0 (present, because
clients read them)."""


def _usage(usage: Usage | None, output_tokens: int, input_tokens: int = 0) -> dict[str, int]:
    """Anthropic's usage. Prompt tokens whose KV the engine re-used from its prefix cache
    are `cache_read_input_tokens` and, as Anthropic counts, not part of `input_tokens`
    (the total prompt is their sum). Skulk caches automatically: nothing is ever written
    on a client's request, so `cache_creation_input_tokens` stays 0."""
    if usage is None:
        return {"input_tokens": input_tokens, **NO_CACHE_USAGE, "output_tokens": output_tokens}
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    return {"input_tokens": usage.prompt_tokens - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached, "output_tokens": usage.completion_tokens}


def sse_event(event: str, payload: dict[str, Any]) -> str:
    """One named server-sent event."""
    return f"event: {event}\ndata: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def sse_error(error: ApiError) -> list[str]:
    """How a stream that already answered 200 reports a failure: an `error` event, which
    the Anthropic SDK raises as an `APIStatusError`."""
    return [sse_event("error", anthropic_error_body(error))]


def _tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments else {}
    except ValueError:  # the parser only emits objects; a foreign engine might not
        arguments = {"arguments": call.arguments}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


_DELTAS = {"thinking": ("thinking_delta", "thinking"), "text": ("text_delta", "text")}


@dataclass
class MessageStreamEncoder:
    """Serialises one message's chunks as Anthropic SSE events: `start()`, `chunk_to_sse()`
    per token chunk, then `finish()` (or `sse_error` on failure). Content blocks open as
    the output needs them: `thinking` for reasoning, `text` for the answer, one `tool_use`
    per call (its whole input in one `input_json_delta`); a message with no output at all
    still carries one empty text block."""

    command_id: str
    model: str
    stop_sequences: Sequence[str] = ()
    _started: bool = field(default=False, init=False)
    _input_tokens: int = field(default=0, init=False)
    _matched: str | None = field(default=None, init=False)
    _finish_reason: str | None = field(default=None, init=False)
    _usage: Usage | None = field(default=None, init=False)
    _count: int = field(default=0, init=False)
    _index: int = field(default=-1, init=False)
    _open: str | None = field(default=None, init=False)
    _tool_calls: int = field(default=0, init=False)

    def start(self) -> list[str]:
        """Nothing yet: `message_start` goes out with the first chunk, which says how long
        the prompt was (its `prompt_tokens`), so the message starts with real input tokens."""
        return []

    def _message_start(self, chunk: TokenChunk | None) -> list[str]:
        if self._started:
            return []
        self._started = True
        if chunk is not None:
            self._input_tokens = chunk.prompt_tokens or (chunk.usage.prompt_tokens if chunk.usage else 0)
        message: dict[str, Any] = {
            "id": message_id(self.command_id), "type": "message", "role": "assistant", "content": [],
            "model": self.model, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self._input_tokens, **NO_CACHE_USAGE, "output_tokens": 0},
        }
        return [sse_event("message_start", {"type": "message_start", "message": message}), sse_event("ping", {"type": "ping"})]

    def _close(self) -> list[str]:
        if self._open is None:
            return []
        self._open = None
        return [sse_event("content_block_stop", {"type": "content_block_stop", "index": self._index})]

    def _begin(self, block: dict[str, Any]) -> list[str]:
        events = self._close()
        self._index += 1
        self._open = block["type"]
        events.append(sse_event("content_block_start",
                                {"type": "content_block_start", "index": self._index, "content_block": block}))
        return events

    def chunk_to_sse(self, chunk: TokenChunk) -> list[str]:
        events = self._message_start(chunk)
        self._count += 1
        self._finish_reason = chunk.finish_reason or self._finish_reason
        self._usage = chunk.usage or self._usage
        self._matched = chunk.stop_sequence or self._matched
        if chunk.text:
            kind = "thinking" if chunk.reasoning else "text"
            if self._open != kind:
                events += self._begin({"type": "thinking", "thinking": "", "signature": ""} if chunk.reasoning
                                      else {"type": "text", "text": ""})
            delta_type, key = _DELTAS[kind]
            events.append(sse_event("content_block_delta", {
                "type": "content_block_delta", "index": self._index, "delta": {"type": delta_type, key: chunk.text},
            }))
        for call in chunk.tool_calls or []:
            self._tool_calls += 1
            block = _tool_use(call)
            events += self._begin({**block, "input": {}})
            events.append(sse_event("content_block_delta", {
                "type": "content_block_delta", "index": self._index,
                "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)},
            }))
        return events

    def finish(self) -> list[str]:
        events = self._message_start(None)
        events += [] if self._index >= 0 else self._begin({"type": "text", "text": ""})
        events += self._close()
        reason, sequence = stop_reason(self._finish_reason, self._matched, self.stop_sequences)
        if self._tool_calls:
            reason, sequence = "tool_use", None
        return [*events, sse_event("message_delta", {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": _usage(self._usage, self._count, self._input_tokens)}), sse_event("message_stop", {"type": "message_stop"})]


def collect_message(
    chunks: Iterable[TokenChunk], *, command_id: str, model: str, stop_sequences: Sequence[str] = ()
) -> dict[str, Any]:
    """The non-streaming `message` for a completed stream's chunks."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    finish_reason: str | None = None
    usage: Usage | None = None
    matched: str | None = None
    count = 0
    for chunk in chunks:
        count += 1
        (thoughts if chunk.reasoning else texts).append(chunk.text)
        calls.extend(chunk.tool_calls or [])
        finish_reason = chunk.finish_reason or finish_reason
        usage = chunk.usage or usage
        matched = chunk.stop_sequence or matched
    text = "".join(texts)
    reason, sequence = stop_reason(finish_reason, matched, stop_sequences)
    content: list[dict[str, Any]] = []
    if thoughts:
        content.append({"type": "thinking", "thinking": "".join(thoughts), "signature": ""})
    if text or not calls:
        content.append({"type": "text", "text": text})
    content += [_tool_use(call) for call in calls]
    if calls:
        reason, sequence = "tool_use", None
    return {
        "id": message_id(command_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(usage, count),
    }


__all__ = [
    "MESSAGE_ID_PREFIX",
    "ContentBlock",
    "CountTokensRequest",
    "InputMessage",
    "MessageStreamEncoder",
    "MessagesRequest",
    "collect_message",
    "count_params",
    "image_urls",
    "message_id",
    "sse_error",
    "sse_event",
    "stop_reason",
    "to_params",
]
