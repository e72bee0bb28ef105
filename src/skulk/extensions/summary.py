"""What `observe_chat_response` receives: an immutable summary of one finished chat
response, built by Skulk from the chunks it already delivered (extensions never own the
response stream, so a buggy observer cannot corrupt, reorder or stall tokens).

`summarise` is pure; it never does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from skulk.shared.types.chunks import TokenChunk

ChatWire = Literal["openai.chat", "openai.responses", "anthropic.messages", "ollama.chat", "ollama.generate"]
"""The wire format a chat request came in: the routes whose requests extensions see."""


@dataclass(frozen=True)
class ChatResponseSummary:
    """One response (one choice of it: a request with `n` choices gives `n` summaries, each
    with its `choice_index`). `error` is the stream error that ended it early (the client
    left, the runner failed after output began), None when it completed."""

    request_id: str
    model_id: str
    wire: ChatWire
    choice_index: int
    text: str
    thinking: str
    finish_reason: str | None
    tool_calls: tuple[str, ...]
    """The names of the tools the model called, in order."""
    prompt_tokens: int | None
    completion_tokens: int | None
    error: str | None = None


def summarise(
    chunks: Iterable[TokenChunk],
    *,
    request_id: str,
    model_id: str,
    wire: ChatWire,
    choice_index: int = 0,
    error: str | None = None,
) -> ChatResponseSummary:
    """The summary of a response whose shaped chunks were `chunks` (reasoning apart)."""
    text: list[str] = []
    thinking: list[str] = []
    tools: list[str] = []
    finish: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    for chunk in chunks:
        (thinking if chunk.reasoning else text).append(chunk.text)
        tools.extend(call.name for call in chunk.tool_calls or ())
        if chunk.prompt_tokens is not None:
            prompt_tokens = chunk.prompt_tokens
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
            completion_tokens = chunk.usage.completion_tokens
        if chunk.finish_reason is not None:
            finish = chunk.finish_reason
    return ChatResponseSummary(
        request_id=request_id,
        model_id=model_id,
        wire=wire,
        choice_index=choice_index,
        text="".join(text),
        thinking="".join(thinking),
        finish_reason=finish,
        tool_calls=tuple(tools),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        error=error,
    )
