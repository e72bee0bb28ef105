"""Separates gpt-oss's harmony channels into reasoning and answer, incrementally.

A harmony model answers in messages, each `<|channel|>NAME<|message|>BODY` closed by
`<|end|>` (more follows, after `<|start|>assistant`), `<|return|>` (the answer is done) or
`<|call|>` (a tool call). The `analysis` channel is the model's reasoning; `final` is the
answer; `commentary` holds what the model says to the user around tool calls, so it is
answer text too. A message addressed `to=functions.NAME` is a tool call: its JSON body
leaves as `<function=NAME>{..}</function>`, which the tool parser turns into a call.
Markers never reach a client: without this splitter they would leak into answers (the
reason a card says `reasoning.format = "harmony"`).

`HarmonySplitter` has `ReasoningSplitter`'s interface (push/flush/settled/in_reasoning):
text is held only while it could still be a marker. Text before any marker is answer text
(a prompt may already open the final channel). Pure and synchronous.
"""

from __future__ import annotations

import re
from typing import Literal

from skulk.api.reasoning import Piece

MARKER_OPEN = "<|"
MARKER_CLOSE = "|>"
MAX_MARKER_CHARS = 24
"""Longer than any harmony marker ('<|constrain|>' is 13): an unclosed '<|' held past this
is text, not a marker, so nothing is held without bound."""
REASONING_CHANNELS = frozenset({"analysis"})
"""Channels whose bodies are reasoning; every other channel's body is answer text."""
BODY_ENDS = frozenset({"<|end|>", "<|return|>", "<|call|>", "<|start|>"})

_Mode = Literal["body", "header", "between"]


RECIPIENT_RE = re.compile(r"\bto=functions\.([A-Za-z0-9_.-]+)")
"""A message addressed to a function tool: a harmony tool call."""


class HarmonySplitter:
    def __init__(self) -> None:
        self._mode: _Mode = "body"
        self._channel = "final"
        self._header = ""
        self._role = ""
        self._calling = False
        self._held = ""

    @property
    def in_reasoning(self) -> bool:
        return self._mode == "body" and self._channel in REASONING_CHANNELS

    @property
    def settled(self) -> bool:
        """Never: a later marker must still be taken out of the text."""
        return False

    def push(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        buffer = self._held + text
        self._held = ""
        while buffer:
            at = buffer.find(MARKER_OPEN)
            if at == -1:
                keep = 1 if buffer.endswith("<") else 0  # could become '<|'
                self._take(buffer[: len(buffer) - keep], out)
                self._held = buffer[len(buffer) - keep:]
                break
            self._take(buffer[:at], out)
            end = buffer.find(MARKER_CLOSE, at + len(MARKER_OPEN))
            if end == -1:
                if len(buffer) - at <= MAX_MARKER_CHARS:
                    self._held = buffer[at:]
                    break
                self._take(buffer[at: at + len(MARKER_OPEN)], out)  # not a marker: text
                buffer = buffer[at + len(MARKER_OPEN):]
                continue
            marker = buffer[at: end + len(MARKER_CLOSE)]
            if len(marker) > MAX_MARKER_CHARS:
                self._take(buffer[at: at + len(MARKER_OPEN)], out)
                buffer = buffer[at + len(MARKER_OPEN):]
                continue
            self._marker(marker, out)
            buffer = buffer[end + len(MARKER_CLOSE):]
        return _merged(out)

    def flush(self) -> list[Piece]:
        """What is still held at the end: an unfinished marker is just text (and a call cut
        off before its end stays an unclosed tag: text, never a call)."""
        held, self._held = self._held, ""
        out: list[Piece] = []
        self._take(held, out)
        return out

    def _take(self, text: str, out: list[Piece]) -> None:
        if not text:
            return
        if self._mode == "body":
            out.append((text, self._channel in REASONING_CHANNELS))
        else:
            # the role after <|start|> and the channel header ('commentary to=functions.f')
            self._header += text

    def _marker(self, marker: str, out: list[Piece]) -> None:
        if marker == "<|channel|>":
            # The role part ('assistant', or 'assistant to=functions.f') is kept for its recipient.
            self._role, self._header, self._mode = self._header, "", "header"
        elif marker == "<|message|>":
            recipient = RECIPIENT_RE.search(f"{self._role} {self._header}")
            if self._mode == "header":
                # 'analysis', or 'commentary to=functions.f <|constrain|>json': the first word
                self._channel = (self._header.split() or ["final"])[0]
            self._mode, self._header, self._role = "body", "", ""
            if recipient is not None:
                # A tool call: its JSON arguments, wrapped as a function tag for the tool
                # parser (`skulk.api.tool_calls`, the card format 'harmony').
                self._channel, self._calling = "commentary", True
                out.append((f"<function={recipient.group(1)}>", False))
        elif marker in BODY_ENDS:
            if self._calling and self._mode == "body":
                out.append(("</function>", False))
            self._mode, self._header, self._role, self._calling = "between", "", "", False
        # '<|constrain|>' and any other marker inside a header: dropped


def _merged(pieces: list[Piece]) -> list[Piece]:
    """Adjacent pieces of the same kind as one (fewer chunk copies downstream)."""
    out: list[Piece] = []
    for text, reasoning in pieces:
        if out and out[-1][1] == reasoning:
            out[-1] = (out[-1][0] + text, reasoning)
        else:
            out.append((text, reasoning))
    return out


__all__ = ["REASONING_CHANNELS", "RECIPIENT_RE", "HarmonySplitter"]
