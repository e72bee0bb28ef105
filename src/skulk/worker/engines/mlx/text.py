"""Text in and out of an HF tokenizer, in the shape the shared streaming helpers want.

The base helpers reassemble UTF-8 from the *bytes* of each token, so a character split
across tokens is released whole. HF tokenizers decode ids to str, which turns half a
character into U+FFFD; `token_bytes_table` therefore maps every id to its raw bytes once, at
load, from the vocabulary itself: byte-level BPE (GPT-2/Llama-3/Qwen) through the inverse of
its byte-to-character alphabet, SentencePiece through its '▁' and '<0xNN>' conventions.
Special tokens map to no bytes: they are control, not text (as llama.cpp detokenizes them).

`prompt_and_tokens` renders chat messages with the tokenizer's own chat template, or takes a raw
prompt, and adds BOS once, only if the tokenizer wants it and the text did not start with it.
Special-token text is parsed only where the template wrote it (see `prompt_pieces`).
"""

from __future__ import annotations

import re
import sys
import threading
from typing import Any

from skulk.shared.reasoning_switches import template_kwargs
from skulk.shared.types.media import IMAGE_MARKER
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import ChatTemplateMissing, chat_message_dict
from skulk.worker.engines.prompt_pieces import (
    Segment,
    continued,
    prompt_pieces,
    render_segments,
    special_token_pattern,
    tokenize_pieces,
)

_SPM_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in character for each byte, inverted: printable
    Latin-1 bytes stand for themselves; the other 68 bytes map, in byte order, to U+0100..."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars: dict[str, int] = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _decoder_kind(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "decoder", None)
    name = type(decoder).__name__ if decoder is not None else ""
    if name == "ByteLevel":
        return "byte_level"
    if "Metaspace" in repr(decoder) or "ByteFallback" in repr(decoder):
        return "sentencepiece"
    return "decode"


def token_bytes_table(tokenizer: Any) -> list[bytes]:
    """Raw bytes of every token id (index = id)."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)  # mlx-lm's TokenizerWrapper wraps the HF one
    size = len(hf)
    special = set(getattr(hf, "all_special_ids", []))
    special.update(i for i, t in getattr(hf, "added_tokens_decoder", {}).items() if getattr(t, "special", False))
    pieces = hf.convert_ids_to_tokens(list(range(size)))
    kind = _decoder_kind(hf)
    alphabet = byte_level_alphabet() if kind == "byte_level" else {}
    table: list[bytes] = []
    for token_id, piece in enumerate(pieces):
        if token_id in special or piece is None:
            table.append(b"")
        elif kind == "byte_level":
            try:
                table.append(bytes(alphabet[c] for c in piece))
            except KeyError:  # an added (non-special) token stored as plain text
                table.append(piece.encode("utf-8"))
        elif kind == "sentencepiece":
            match = _SPM_BYTE.match(piece)
            table.append(bytes([int(match.group(1), 16)]) if match else piece.replace("\u2581", " ").encode("utf-8"))
        else:
            table.append(hf.decode([token_id]).encode("utf-8"))
    return table


def special_tokens(tokenizer: Any) -> dict[str, int]:
    """Text -> id of the tokenizer's special added tokens ('<|eot_id|>'): the ones only a
    chat template's own text may produce (see `prompt_pieces`)."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    return {
        token.content: token_id
        for token_id, token in getattr(hf, "added_tokens_decoder", {}).items()
        if getattr(token, "special", False) and token.content
    }


def images_as(segments: list[Segment], image_token: str) -> list[Segment]:
    """`segments` with every IMAGE_MARKER in caller text replaced by `image_token` as a
    template stretch, so it is parsed as the model's image token (the API refuses caller
    text holding the marker: each marker is an image)."""
    out: list[Segment] = []
    for segment in segments:
        if segment.trusted or IMAGE_MARKER not in segment.text:
            out.append(segment)
            continue
        parts = segment.text.split(IMAGE_MARKER)
        for index, part in enumerate(parts):
            if index:
                out.append(Segment(image_token, True))
            if part:
                out.append(Segment(part, False))
    return out


def prompt_and_tokens(
    tokenizer: Any,
    request: TextGenerationParams,
    *,
    specials: dict[str, int] | None = None,
    limit: int | None = None,
    cancelled: threading.Event | None = None,
    switches: tuple[str, ...] = (),
    image_token: str | None = None,
) -> tuple[str, list[int]]:
    """The rendered prompt and the exact ids the model sees for `request`. Special-token
    text is parsed only where the chat template (or a raw prompt's author) wrote it; caller
    content is encoded with special-token splitting, so '<|eot_id|>' there is text. With
    `limit`, stops with `PromptOverContext` once that many tokens are reached; with
    `cancelled`, stops with `PromptCancelled` once it is set. With `image_token` (a special
    token of the tokenizer), each image marker becomes that token (`images_as`)."""
    if request.prompt is not None:
        text, segments = request.prompt, [Segment(request.prompt, True)]
    else:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateMissing("this model has no chat template; send a raw `prompt` instead of `messages`")
        tools = [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in request.tools
        ] or None

        # The card's reasoning switches carry the request's thinking / effort into the template.
        extra = template_kwargs(switches, request.thinking, request.reasoning_effort)

        def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
            return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False,
                                                 **extra)

        rendered, segments = render_segments(render, [chat_message_dict(m) for m in request.messages], tools)
        text, segments = continued(rendered, segments, request.continue_from)
        if image_token is not None:
            segments = images_as(segments, image_token)
    specials = special_tokens(tokenizer) if specials is None else specials
    pieces = prompt_pieces(segments, special_token_pattern(specials), specials)
    bos = getattr(tokenizer, "bos_token_id", None)
    wants_bos = bos is not None and bos in tokenizer.encode("", add_special_tokens=True)
    add_bos = wants_bos and not (pieces and pieces[0] == bos)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    bound = (limit - int(add_bos)) if limit is not None else sys.maxsize
    tokens = tokenize_pieces(pieces, encode, limit=bound, cancelled=cancelled)
    if add_bos and bos is not None:  # add_bos implies a bos; this says so to the checker
        tokens.insert(0, bos)
    return text, tokens


__all__ = ["byte_level_alphabet", "images_as", "prompt_and_tokens", "special_tokens", "token_bytes_table"]
