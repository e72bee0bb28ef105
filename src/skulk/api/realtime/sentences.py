"""Where a streamed answer can be handed to the voice: whole sentences, as the text grows.

The response step speaks each sentence as soon as the chat model has finished it, rather
than after the whole answer, so the first audio follows the first sentence. Pure: text in,
(sentences ready, the rest) out.
"""

from __future__ import annotations

import re

MAX_SENTENCE_CHARS = 400
"""A run of text this long with no sentence end is spoken anyway, cut at its last space (a
model that never writes a full stop still gets a voice)."""

_END = re.compile(r"[.!?\u3002\uff01\uff1f]+[\"')\]\u201d\u2019]*(?=\s)|\n+")
"""A sentence ends at terminal punctuation (closing quotes and brackets included) followed by
whitespace, or at a line break."""


def split_sentences(text: str) -> tuple[list[str], str]:
    """The whole sentences at the start of `text` (stripped, none empty), and what follows
    them, still open."""
    sentences: list[str] = []
    start = 0
    for end in _END.finditer(text):
        sentence = text[start:end.end()].strip()
        if sentence:
            sentences.append(sentence)
        start = end.end()
    rest = text[start:]
    while len(rest) > MAX_SENTENCE_CHARS:
        cut = rest.rfind(" ", 0, MAX_SENTENCE_CHARS)
        cut = cut if cut > 0 else MAX_SENTENCE_CHARS
        if rest[:cut].strip():
            sentences.append(rest[:cut].strip())
        rest = rest[cut:]
    return sentences, rest


__all__ = ["MAX_SENTENCE_CHARS", "split_sentences"]
