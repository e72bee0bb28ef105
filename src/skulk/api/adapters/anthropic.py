"""The Anthropic Messages wire format (`POST /v1/messages`), both ways.

Incoming: `MessagesRequest` (what the Anthropic SDK sends; unknown fields such as
`metadata` are ignored) and `to_params`, which normalises it into the internal
`TextGenerationParams` or raises `InvalidRequest` naming the parameter to fix. Outgoing:
`MessageStreamEncoder` turns token chunks into Anthropic's named SSE events
(message_start, content_block_start, ping, content_block_delta*, content_block_stop,
message_delta, message_stop) and `collect_message` builds the non-streaming `message`.

Pure translation only: this module must never touch streams, commands or the cluster.
Only text content is supported; tool use, images and documents are refused with a 400
naming the block, and reasoning output (thinking) is not forwarded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from skulk.api.errors import ApiError, InvalidRequest, anthropic_error_body, invalid_request_from_validation
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.common import ChatMessage, Usage
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


class ContentBlock(_Lenient):
    """One content block. Only `text` blocks are supported; the others are accepted by the
    schema so that `to_params` can name them in a clear 400."""

    type: str
    text: str | None = None


class InputMessage(_Lenient):
    role: str
    content: str | list[ContentBlock]


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
    tools: list[dict[str, Any]] | None = None


def _text(content: str | list[ContentBlock], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
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


def to_params(request: MessagesRequest) -> TextGenerationParams:
    """The internal generation request, or `InvalidRequest` naming the parameter at fault."""
    if not request.model.strip():
        raise InvalidRequest("model: must name a model.", param="model")
    if not request.messages:
        raise InvalidRequest("messages: at least one message is required.", param="messages")
    if request.max_tokens < 1:
        raise InvalidRequest(f"max_tokens: must be at least 1, got {request.max_tokens}.", param="max_tokens")
    if request.tools:
        raise InvalidRequest("tools: tool use is not supported on /v1/messages yet.", param="tools")
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
        messages.append(ChatMessage(role=message.role, content=_text(message.content, f"{where}.content")))
    try:
        return TextGenerationParams(
            model_id=request.model,
            messages=messages,
            max_tokens=request.max_tokens,
            temperature=temperature,
            top_p=None if top_p is None else max(top_p, MIN_TOP_P),
            top_k=request.top_k,
            stop=stops,
            stream=bool(request.stream),
        )
    except ValidationError as error:
        raise invalid_request_from_validation(error) from None


# ---------------------------------------------------------------------------------------
# Response pieces
# ---------------------------------------------------------------------------------------


def message_id(command_id: str) -> str:
    return f"{MESSAGE_ID_PREFIX}{command_id}"


def stop_reason(finish_reason: str | None, text: str, stop_sequences: Sequence[str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for how a generation ended: `length` -> max_tokens; a
    stop with one of the request's stop sequences seen at the end of the text ->
    stop_sequence; anything else -> end_turn.

    The internal chunk does not say which stop string matched, and engines drop it from
    the text; it is recognised only when the engine kept it, otherwise the turn reads as
    ended (end_turn)."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "stop":
        for stop in stop_sequences:
            if stop and text.endswith(stop):
                return "stop_sequence", stop
    return "end_turn", None


def _usage(usage: Usage | None, output_tokens: int) -> dict[str, int]:
    if usage is None:
        return {"input_tokens": 0, "output_tokens": output_tokens}
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}


def sse_event(event: str, payload: dict[str, Any]) -> str:
    """One named server-sent event."""
    return f"event: {event}\ndata: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def sse_error(error: ApiError) -> list[str]:
    """How a stream that already answered 200 reports a failure: an `error` event, which
    the Anthropic SDK raises as an `APIStatusError`."""
    return [sse_event("error", anthropic_error_body(error))]


@dataclass
class MessageStreamEncoder:
    """Serialises one message's chunks as Anthropic SSE events: `start()`, `chunk_to_sse()`
    per token chunk, then `finish()` (or `sse_error` on failure)."""

    command_id: str
    model: str
    stop_sequences: Sequence[str] = ()
    _text: list[str] = field(default_factory=list, init=False)
    _finish_reason: str | None = field(default=None, init=False)
    _usage: Usage | None = field(default=None, init=False)
    _count: int = field(default=0, init=False)

    def start(self) -> list[str]:
        message = {
            "id": message_id(self.command_id), "type": "message", "role": "assistant", "content": [],
            "model": self.model, "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [
            sse_event("message_start", {"type": "message_start", "message": message}),
            sse_event("content_block_start",
                      {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            sse_event("ping", {"type": "ping"}),
        ]

    def chunk_to_sse(self, chunk: TokenChunk) -> list[str]:
        self._count += 1
        self._finish_reason = chunk.finish_reason or self._finish_reason
        self._usage = chunk.usage or self._usage
        if chunk.reasoning or not chunk.text:
            return []
        self._text.append(chunk.text)
        return [sse_event("content_block_delta", {
            "type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": chunk.text},
        })]

    def finish(self) -> list[str]:
        reason, sequence = stop_reason(self._finish_reason, "".join(self._text), self.stop_sequences)
        return [
            sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            sse_event("message_delta", {
                "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": _usage(self._usage, self._count),
            }),
            sse_event("message_stop", {"type": "message_stop"}),
        ]


def collect_message(
    chunks: Iterable[TokenChunk], *, command_id: str, model: str, stop_sequences: Sequence[str] = ()
) -> dict[str, Any]:
    """The non-streaming `message` for a completed stream's chunks."""
    texts: list[str] = []
    finish_reason: str | None = None
    usage: Usage | None = None
    count = 0
    for chunk in chunks:
        count += 1
        if not chunk.reasoning:
            texts.append(chunk.text)
        finish_reason = chunk.finish_reason or finish_reason
        usage = chunk.usage or usage
    text = "".join(texts)
    reason, sequence = stop_reason(finish_reason, text, stop_sequences)
    return {
        "id": message_id(command_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": _usage(usage, count),
    }


__all__ = [
    "MESSAGE_ID_PREFIX",
    "ContentBlock",
    "InputMessage",
    "MessageStreamEncoder",
    "MessagesRequest",
    "collect_message",
    "message_id",
    "sse_error",
    "sse_event",
    "stop_reason",
    "to_params",
]
