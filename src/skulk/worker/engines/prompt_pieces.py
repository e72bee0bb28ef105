"""Which parts of a rendered prompt the chat template wrote, and tokenizing it in linear time.

Two problems with "render the chat, then tokenize the whole text with special tokens parsed":
- a caller's text is parsed too, so `<|eot_id|>` in a user message becomes the real
  end-of-turn token and the caller can close their turn and forge a system turn;
- llama.cpp's special-token partitioning is quadratic in the number of special-token
  fragments (8k messages took 12 s; 100k messages kept a runner busy for over 12 minutes).

Here the template is rendered twice: once as asked, once with every caller string (message
content, tool-call arguments and names, tool descriptions) replaced by an alphanumeric
marker that survives any escaping a template applies (`tojson`, `trim`). The marked render
says which stretches of the real render the template wrote (`attribute_render`). Only those
stretches are searched for special-token text, by one regular expression built once per
model (`special_token_pattern`); the result is a list of pieces, a special token's id or a
run of text (`prompt_pieces`), and every text run is tokenized with special-token parsing
off (`tokenize_pieces`). For ordinary conversations the ids are those of the old whole-text
tokenization; a caller's control-token text stays plain text.

A raw completion `prompt` is the caller's own template: it is attributed to the template as
a whole (its special-token text is parsed), still in linear time.

This module is pure: no engine library, no threads. Engines pass their tokenizer in.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

MARKER_PREFIX: Final = "SKULKSLOT"
"""Markers are `SKULKSLOT<nonce>N<index>E`: letters and digits only, so `tojson`, HTML
escaping and `trim` leave them intact, and a per-request random nonce, so no caller text
can contain one."""

NONCE_HEX_CHARS: Final = 16

REASONING_OPEN: Final = "<think>"
REASONING_CLOSE: Final = "</think>"

SCHEMA_FREE_TEXT_KEYS: Final = frozenset({"description", "title"})
"""Keys of a tool's JSON schema whose string values are prose a caller wrote."""


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of the rendered prompt: `trusted` when the chat template wrote it (its
    special-token text is parsed), untrusted when it is caller text (never parsed)."""

    text: str
    trusted: bool


Piece = int | str
"""A special token's id (from trusted text), or a run of text tokenized without specials."""


class PromptCancelled(Exception):
    """The request was cancelled while its prompt was being tokenized."""


class PromptOverContext(Exception):
    """The prompt reached `limit` tokens before it was fully tokenized."""

    def __init__(self, tokens_so_far: int, limit: int) -> None:
        super().__init__(f"prompt is at least {tokens_so_far} tokens (limit {limit})")
        self.tokens_so_far = tokens_so_far
        self.limit = limit


def new_nonce() -> str:
    return secrets.token_hex(NONCE_HEX_CHARS // 2)


def _marker(nonce: str, index: int) -> str:
    return f"{MARKER_PREFIX}{nonce}N{index}E"


def mark_caller_text(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, nonce: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, str]]:
    """Copies of `messages` and `tools` with each caller string replaced by a marker, and
    marker -> original string: message content, names and tool-call ids, tool-call names and
    arguments, tool descriptions and the free text of a tool's parameter schema
    (`SCHEMA_FREE_TEXT_KEYS`). Types, names and keys stay: templates branch on them, and
    renaming keys would reorder a template's sorted JSON."""
    slots: dict[str, str] = {}

    def slot(value: Any) -> Any:
        if not isinstance(value, str) or not value:
            return value
        marker = _marker(nonce, len(slots))
        slots[marker] = value
        return marker

    def slot_free_text(value: Any) -> Any:
        # Only free text: templates branch on a schema's types and names, never on prose.
        if isinstance(value, dict):
            return {key: slot(item) if key in SCHEMA_FREE_TEXT_KEYS else slot_free_text(item)
                    for key, item in value.items()}
        if isinstance(value, list):
            return [slot_free_text(item) for item in value]
        return value

    marked_messages: list[dict[str, Any]] = []
    for message in messages:
        copy = dict(message)
        for field in ("content", "name", "tool_call_id", "reasoning_content", "thinking"):
            if field in copy:
                copy[field] = slot(copy[field])
        if copy.get("tool_calls"):
            copy["tool_calls"] = [
                {**call, "function": {**call["function"], "name": slot(call["function"].get("name")),
                                      "arguments": slot(call["function"].get("arguments"))}}
                for call in copy["tool_calls"]
            ]
        marked_messages.append(copy)
    marked_tools = None
    if tools:
        marked_tools = [
            {**tool, "function": {**tool["function"], "description": slot(tool["function"].get("description")),
                                  "parameters": slot_free_text(tool["function"].get("parameters"))}}
            for tool in tools
        ]
    return marked_messages, marked_tools, slots


def _renderings(value: str) -> list[str]:
    """How templates commonly write a caller string: as is, trimmed, JSON-escaped (jinja's
    `tojson` escapes non-ASCII and `<>&'`; Hugging Face's keeps non-ASCII), or, for an old
    assistant turn, without its reasoning (Qwen3 and DeepSeek-R1 templates)."""
    candidates = [value, value.strip()]
    if REASONING_CLOSE in value:  # reasoning templates drop an old turn's thinking
        answer = value.split(REASONING_CLOSE)[-1]
        candidates.extend([answer, answer.lstrip("\n"), answer.strip()])
    for dumped in (json.dumps(value, ensure_ascii=False), json.dumps(value)):
        candidates.append(dumped[1:-1])
        candidates.append(dumped)
    html = (json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026").replace("'", "\\u0027"))
    candidates.extend([html[1:-1], html])
    return list(dict.fromkeys(candidates))


def attribute_render(rendered: str, marked: str, slots: Mapping[str, str]) -> list[Segment]:
    """`rendered` cut into template and caller stretches, using the marked render `marked`.

    Every template stretch of `marked` must appear in `rendered` in order, and each caller
    stretch must be one of the usual renderings of its original string (`_renderings`).
    When a template transforms caller text in another way, the prompt is rebuilt from the
    marked render with the original strings in place instead: the text may differ from the
    template's by that transform, but no caller text is ever attributed to the template.
    When the template rewrote a marker itself, nothing is attributed to it at all."""
    if not slots:
        return [Segment(rendered, True)] if rendered else []
    pattern = re.compile("(" + "|".join(re.escape(m) for m in slots) + ")")
    parts = pattern.split(marked)  # template, marker, template, marker, ..., template
    if any(MARKER_PREFIX.lower() in part.lower() for part in parts[::2]):
        # The template rewrote a marker (changed its case, cut it): the marked render says
        # nothing reliable about the real one, so none of it is trusted with special tokens.
        return [Segment(rendered, False)] if rendered else []
    segments: list[Segment] = []
    position = 0
    for index, part in enumerate(parts):
        if index % 2 == 0:
            if not rendered.startswith(part, position):
                return _substituted(parts, slots)
            segments.append(Segment(part, True))
            position += len(part)
            continue
        following = parts[index + 1]
        end_of_text = index + 1 == len(parts) - 1
        for candidate in _renderings(slots[part]):
            after = position + len(candidate)
            fits = after + len(following) == len(rendered) if end_of_text else True
            if rendered.startswith(candidate, position) and rendered.startswith(following, after) and fits:
                segments.append(Segment(candidate, False))
                position = after
                break
        else:
            return _substituted(parts, slots)
    if position != len(rendered):
        return _substituted(parts, slots)
    return _merged(segments)


def _substituted(parts: list[str], slots: Mapping[str, str]) -> list[Segment]:
    return _merged([Segment(slots[part], False) if i % 2 else Segment(part, True) for i, part in enumerate(parts)])


def _merged(segments: Sequence[Segment]) -> list[Segment]:
    merged: list[Segment] = []
    for segment in segments:
        if not segment.text:
            continue
        if merged and merged[-1].trusted == segment.trusted:
            merged[-1] = Segment(merged[-1].text + segment.text, segment.trusted)
        else:
            merged.append(segment)
    return merged


def special_token_pattern(special_tokens: Mapping[str, int]) -> re.Pattern[str] | None:
    """One alternation of every special token's text, longest first (as llama.cpp and
    Hugging Face match them), or None for a vocabulary without any."""
    texts = sorted((text for text in special_tokens if text), key=len, reverse=True)
    return re.compile("|".join(re.escape(text) for text in texts)) if texts else None


def prompt_pieces(
    segments: Sequence[Segment], pattern: re.Pattern[str] | None, special_tokens: Mapping[str, int]
) -> list[Piece]:
    """Special-token ids found in trusted text, and the text between them merged into runs
    (caller text included), in order. Linear in the prompt's length."""
    pieces: list[Piece] = []

    def add_text(text: str) -> None:
        if not text:
            return
        if pieces and isinstance(pieces[-1], str):
            pieces[-1] += text
        else:
            pieces.append(text)

    for segment in segments:
        if not segment.trusted or pattern is None:
            add_text(segment.text)
            continue
        position = 0
        for match in pattern.finditer(segment.text):
            add_text(segment.text[position : match.start()])
            pieces.append(special_tokens[match.group()])
            position = match.end()
        add_text(segment.text[position:])
    return pieces


def tokenize_pieces(
    pieces: Sequence[Piece],
    encode_text: Callable[[str], Sequence[int]],
    *,
    limit: int,
    cancelled: threading.Event | None = None,
) -> list[int]:
    """The token ids of `pieces`, each text run through `encode_text` (specials off).

    Stops early: `PromptCancelled` once `cancelled` is set (checked between runs), and
    `PromptOverContext` as soon as `limit` tokens are reached, so an over-long or abandoned
    prompt costs at most one run's tokenization past the point where it was decided."""
    tokens: list[int] = []
    for piece in pieces:
        if cancelled is not None and cancelled.is_set():
            raise PromptCancelled
        if isinstance(piece, int):
            tokens.append(piece)
        else:
            tokens.extend(encode_text(piece))
        if len(tokens) >= limit:
            raise PromptOverContext(len(tokens), limit)
    return tokens


def render_segments(
    render: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str],
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    nonce: str | None = None,
) -> tuple[str, list[Segment]]:
    """Render the conversation (as the template writes it) and attribute each stretch."""
    rendered = render([dict(m) for m in messages], [dict(t) for t in tools] if tools else None)
    marked_messages, marked_tools, slots = mark_caller_text(messages, tools, nonce or new_nonce())
    marked = render(marked_messages, marked_tools)
    return rendered, attribute_render(rendered, marked, slots)


def opens_reasoning(rendered_prompt: str) -> bool:
    """True when a rendered chat prompt ends inside an opened think block (the template, not
    the model, wrote `<think>`: DeepSeek-R1 style). The engine then reports that `<think>`
    as the output's first token, so the API tells the reasoning from the answer."""
    return rendered_prompt.rstrip().endswith(REASONING_OPEN)


def continued(rendered: str, segments: Sequence[Segment], continue_from: str | None) -> tuple[str, list[Segment]]:
    """The rendered chat with the assistant turn's opening text after it (a request's
    `continue_from`), as a template stretch: it is the model's own output and the card's
    closing marker, so its special-token text is parsed (gpt-oss's channel markers, a
    `</think>` the vocabulary holds as one token). When the template opened the think block
    itself, the `<think>` an engine reported for it (it is no output of the model) is not
    written a second time."""
    if not continue_from:
        return rendered, list(segments)
    text = continue_from
    if opens_reasoning(rendered) and text.startswith(REASONING_OPEN):
        text = text[len(REASONING_OPEN):]
    return rendered + text, [*segments, Segment(text, True)]


__all__ = [
    "MARKER_PREFIX",
    "Piece",
    "PromptCancelled",
    "PromptOverContext",
    "Segment",
    "attribute_render",
    "continued",
    "mark_caller_text",
    "new_nonce",
    "opens_reasoning",
    "prompt_pieces",
    "render_segments",
    "special_token_pattern",
    "tokenize_pieces",
]
