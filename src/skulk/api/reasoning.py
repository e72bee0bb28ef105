"""Separates a model's `<think>...</think>` reasoning from its answer, incrementally.

Reasoning models (Qwen3, DeepSeek-R1 distills, QwQ) open their output with a `<think>`
block. `ReasoningSplitter.push(text)` takes each streamed piece and returns the pieces
that can be released now, each marked reasoning or not; `flush()` releases what is held at
the end. Text is held only while it could still be the start of a tag, so streaming stays
token by token. A block is recognised only at the very start of the output (after
whitespace): prose that mentions "<think>" later is left alone. Whitespace between
`</think>` and the answer is dropped, as the models' own templates do.

Pure and synchronous: it never sees chunks, streams or wire formats.
"""

from __future__ import annotations

from typing import Literal

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"

Piece = tuple[str, bool]
"""(text, is_reasoning)"""

_Mode = Literal["start", "reasoning", "after", "content"]


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


class ReasoningSplitter:
    def __init__(self, open_tag: str = OPEN_TAG, close_tag: str = CLOSE_TAG) -> None:
        """`open_tag`/`close_tag`: the card's `reasoning.start_tag`/`end_tag` when it names
        them (`think_tags`), else `<think>`/`</think>`."""
        self._open, self._close = open_tag, close_tag
        self._mode: _Mode = "start"
        self._held = ""

    @property
    def in_reasoning(self) -> bool:
        return self._mode == "reasoning"

    @property
    def settled(self) -> bool:
        """True once everything from here on is answer text: `push` returns its input
        unchanged, so a caller may skip it."""
        return self._mode == "content" and not self._held

    def push(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        buffer = self._held + text
        self._held = ""
        while buffer:
            if self._mode == "content":
                out.append((buffer, False))
                break
            if self._mode == "start":
                head = buffer.lstrip()
                if head.startswith(self._open):
                    self._mode = "reasoning"
                    buffer = head[len(self._open):]
                    continue
                if self._open.startswith(head):  # empty, or could still become the tag
                    self._held = buffer
                    break
                self._mode = "content"
                continue
            if self._mode == "reasoning":
                at = buffer.find(self._close)
                if at != -1:
                    if at:
                        out.append((buffer[:at], True))
                    self._mode = "after"
                    buffer = buffer[at + len(self._close):]
                    continue
                keep = _partial_suffix(buffer, self._close)
                if len(buffer) > keep:
                    out.append((buffer[: len(buffer) - keep], True))
                self._held = buffer[len(buffer) - keep:]
                break
            # "after": drop the whitespace that separates the reasoning from the answer
            buffer = buffer.lstrip()
            if buffer:
                self._mode = "content"
        return out

    def flush(self) -> list[Piece]:
        """What is still held at the end: an unfinished tag prefix is just text."""
        held, self._held = self._held, ""
        if not held:
            return []
        return [(held, self._mode == "reasoning")]


__all__ = ["CLOSE_TAG", "OPEN_TAG", "Piece", "ReasoningSplitter"]
