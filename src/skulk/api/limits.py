"""Bounds on what one API request may ask of the cluster, and the pure checks that apply them.

One request must never wedge a model for everyone: the body is bounded before it is parsed
(`body_size_error`, applied by `skulk.api.body_guard` while the body streams in), every JSON
body holds only valid Unicode and finite numbers (`json_value_error`), and a normalised
generation or embedding request is bounded in messages, text and a cheap lower bound of its
prompt tokens against the instance's context (`generation_limits_error`,
`embedding_limits_error`) before anything is queued on a runner.

Every bound is a named constant, documented once here (the body-size bounds in
`skulk.shared.body_limits`, which the node's config validates against too; re-exported). This module decides; it never reads
a socket or the clock (the body guard and the generation path are its shells).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Final

from skulk.api import media
from skulk.api.errors import ApiError, InvalidRequest, PayloadTooLarge
from skulk.shared.body_limits import DEFAULT_MAX_BODY_BYTES, MAX_MAX_BODY_BYTES, MIN_MAX_BODY_BYTES
from skulk.shared.types.tasks import TextGenerationParams
from skulk.shared.types.workload_io import EmbeddingParams, OneResultParams

MAX_MESSAGES: Final = 8192
"""Messages in one chat request. Every message costs a few template tokens (role headers),
so 8192 messages already fill a 32k context with headers alone; a 100k-message request
(3.5 MB, which kept a runner at 100% for 12+ minutes before) is refused at the API."""

MAX_ARRAY_OBJECTS: Final = MAX_MESSAGES
"""Objects in any one JSON array of a body (messages, Responses input items, Anthropic
content blocks): checked while the body is vetted, before the route parses it, so an
oversized conversation is refused in one pass over the raw JSON whatever its wire format."""

MAX_TEXT_CHARS: Final = 4 * 1024 * 1024
"""Characters in any one caller string (a message's content, a raw prompt, a tool's
arguments, an embedding input): a 1M-token context's worth of text."""

MAX_TOOLS: Final = 512
"""Tools offered in one request (OpenAI allows 128; agents with big tool sets stay under)."""

MAX_STOP_SEQUENCES: Final = 16
"""Stop strings in one request (OpenAI allows 4); each is scanned on every output token."""

MAX_EMBEDDING_INPUTS: Final = 2048
"""Inputs in one embedding request (OpenAI's own limit)."""

MAX_BYTES_PER_TOKEN: Final = 256
"""No token of any vocabulary we serve spells more than this many UTF-8 bytes (the longest
in common vocabularies are runs of whitespace or punctuation, well under 256). So a prompt
of B bytes is at least B / 256 tokens: a sound lower bound, cheap enough to refuse a prompt
that cannot fit the context before it reaches a runner's queue. The exact count is the
engine's (it stops tokenizing as soon as the context is reached)."""

MAX_JSON_DEPTH: Final = 64
"""Nesting of a JSON body (tool schemas are the deepest legitimate part, a few levels)."""


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The limits one API applies; only the body size is an operator setting."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES


# ---------------------------------------------------------------------------------------
# The body, before it is parsed
# ---------------------------------------------------------------------------------------


def body_size_error(size_bytes: int | None, limit_bytes: int, *, audio: bool = False) -> PayloadTooLarge | None:
    """The refusal of a body of `size_bytes` (declared or read so far), or None. `audio`:
    the body is an audio upload, bounded by its own limit (`skulk.shared.body_limits`)."""
    if size_bytes is None or size_bytes <= limit_bytes:
        return None
    if audio:
        return PayloadTooLarge(f"The audio upload is larger than this node accepts ({limit_bytes} bytes with its "
                               "form; the file itself at most 25 MiB).", param="file", code="audio_too_large")
    return PayloadTooLarge(
        f"The request body is larger than this node accepts ({limit_bytes} bytes; "
        f"api.max_body_bytes in skulk.yaml or SKULK_API_MAX_BODY_BYTES)."
    )


def declared_length(raw: bytes | None) -> int | ApiError | None:
    """A Content-Length header as a number (None: absent), or the error for a malformed one."""
    if raw is None:
        return None
    text = raw.decode("latin-1").strip()
    if not text.isdigit():
        return InvalidRequest("The Content-Length header is not a number.", code="invalid_content_length")
    return int(text)


_SURROGATE = re.compile("[\ud800-\udfff]")


class _NotFinite(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _NotFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value


def json_value_error(body: bytes) -> InvalidRequest | None:
    """The refusal of a JSON body holding a string that is not valid Unicode (a lone UTF-16
    surrogate such as "\\ud800", in a key or a value), a non-finite number (NaN, Infinity,
    1e999), nesting deeper than `MAX_JSON_DEPTH` or an array of more than
    `MAX_ARRAY_OBJECTS` objects; None for a valid body, and None for a
    body that is not JSON at all (the route's own parser says what is wrong with it)."""
    try:
        value = json.loads(body, parse_constant=_reject_constant, parse_float=_finite_float)
    except _NotFinite as exc:
        return InvalidRequest(f"The request holds a number JSON cannot carry ({exc}); numbers must be finite.",
                              code="invalid_number")
    except RecursionError:
        return _too_deep()
    except ValueError:  # not JSON (or not UTF-8): the route answers in its own words
        return None
    return _walk(value)


def _too_deep() -> InvalidRequest:
    return InvalidRequest(f"The request body is nested more than {MAX_JSON_DEPTH} levels deep.", code="too_deep")


def _bad_string(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def _walk(value: Any) -> InvalidRequest | None:
    stack: list[tuple[Any, int, str | None]] = [(value, 0, None)]
    while stack:
        item, depth, key = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return _too_deep()
        if isinstance(item, str):
            if _bad_string(item):
                return _invalid_unicode()
        elif isinstance(item, dict):
            for name, child in item.items():
                if _bad_string(name):
                    return _invalid_unicode()
                stack.append((child, depth + 1, name))
        elif isinstance(item, list):
            objects = sum(1 for child in item if isinstance(child, dict))
            if objects > MAX_ARRAY_OBJECTS:
                return InvalidRequest(f"'{key}' holds {objects} items; the limit is {MAX_ARRAY_OBJECTS}.",
                                      param=key, code="array_above_max_length")
            stack.extend((child, depth + 1, key) for child in item)
    return None


def _invalid_unicode() -> InvalidRequest:
    return InvalidRequest("The request holds a string that is not valid Unicode (a lone UTF-16 surrogate escape "
                          "such as \\ud800); send text as valid UTF-8.", code="invalid_unicode")


# ---------------------------------------------------------------------------------------
# A normalised request, before it is queued
# ---------------------------------------------------------------------------------------


def _text_too_long(param: str, text: str | None) -> InvalidRequest | None:
    if text is not None and len(text) > MAX_TEXT_CHARS:
        return InvalidRequest(f"'{param}' is {len(text)} characters; the limit is {MAX_TEXT_CHARS}.",
                              param=param, code="string_above_max_length")
    return None


def _first(*errors: InvalidRequest | None) -> InvalidRequest | None:
    return next((error for error in errors if error is not None), None)


def prompt_bytes_lower_bound(params: TextGenerationParams) -> int:
    """UTF-8 bytes of the caller text a prompt will hold at least (templates only add)."""
    if params.prompt is not None:
        return len(params.prompt.encode("utf-8", "surrogatepass"))
    return sum(len((m.content or "").encode("utf-8", "surrogatepass")) for m in params.messages)


def generation_limits_error(params: TextGenerationParams) -> InvalidRequest | None:
    """The first bound `params` breaks, as a typed 400 naming it, or None."""
    if len(params.messages) > MAX_MESSAGES:
        return InvalidRequest(f"'messages' holds {len(params.messages)} messages; the limit is {MAX_MESSAGES}.",
                              param="messages", code="array_above_max_length")
    if len(params.tools) > MAX_TOOLS:
        return InvalidRequest(f"'tools' holds {len(params.tools)} tools; the limit is {MAX_TOOLS}.",
                              param="tools", code="array_above_max_length")
    if len(params.stop) > MAX_STOP_SEQUENCES:
        return InvalidRequest(f"'stop' holds {len(params.stop)} sequences; the limit is {MAX_STOP_SEQUENCES}.",
                              param="stop", code="array_above_max_length")
    return _first(
        media.check_request(params.messages, params.prompt),
        _text_too_long("prompt", params.prompt),
        *(_text_too_long(f"messages[{i}].content", m.content) for i, m in enumerate(params.messages)),
        *(_text_too_long(f"messages[{i}].tool_calls", call.arguments)
          for i, m in enumerate(params.messages) for call in m.tool_calls),
    )


def context_error(params: TextGenerationParams, context_tokens: int) -> InvalidRequest | None:
    """A prompt whose lower bound of tokens (`MAX_BYTES_PER_TOKEN`, and
    `media.IMAGE_TOKENS_ESTIMATE` per image) already fills the bound instance's context,
    refused before any runner queues it; None when it may fit."""
    at_least = -(-prompt_bytes_lower_bound(params) // MAX_BYTES_PER_TOKEN) \
        + media.image_count(params.messages) * media.IMAGE_TOKENS_ESTIMATE
    if at_least < context_tokens:
        return None
    return InvalidRequest(
        f"The prompt is at least {at_least} tokens; {params.model_id} is placed with a context of "
        f"{context_tokens} tokens.", param="prompt" if params.prompt is not None else "messages",
        code="context_length_exceeded",
    )


def embedding_limits_error(params: EmbeddingParams) -> InvalidRequest | None:
    inputs = params.embedding_inputs
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        return InvalidRequest(f"'input' holds {len(inputs)} items; the limit is {MAX_EMBEDDING_INPUTS}.",
                              param="input", code="array_above_max_length")
    return _first(*(_text_too_long(f"input[{i}]", item) for i, item in enumerate(params.inputs)),
                  *(InvalidRequest(f"'input[{i}]' holds {len(item)} tokens; the limit is {MAX_TEXT_CHARS}.",
                                   param=f"input[{i}]", code="array_above_max_length")
                    for i, item in enumerate(params.token_inputs) if len(item) > MAX_TEXT_CHARS))


def workload_limits_error(params: OneResultParams) -> InvalidRequest | None:
    """The first bound a one-result workload's request breaks (embeddings: inputs and their
    lengths; echo: its params model bounds its text), or None."""
    if isinstance(params, EmbeddingParams):
        return embedding_limits_error(params)
    return None


__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_ARRAY_OBJECTS",
    "MAX_BYTES_PER_TOKEN",
    "MAX_EMBEDDING_INPUTS",
    "MAX_JSON_DEPTH",
    "MAX_MAX_BODY_BYTES",
    "MAX_MESSAGES",
    "MAX_STOP_SEQUENCES",
    "MAX_TEXT_CHARS",
    "MAX_TOOLS",
    "MIN_MAX_BODY_BYTES",
    "RequestLimits",
    "body_size_error",
    "context_error",
    "declared_length",
    "embedding_limits_error",
    "generation_limits_error",
    "json_value_error",
    "prompt_bytes_lower_bound",
    "workload_limits_error",
]
