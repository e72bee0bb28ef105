"""The token loops every engine shares, written once.

An in-process engine (llama.cpp, MLX) samples token ids; what turns them into what a client
sees is the same bookkeeping everywhere: stop at the caller's cancellation, an
end-of-generation token or a stop string (its text dropped, its name kept), hold back bytes
of an unfinished UTF-8 sequence and text that might start a stop string, stop at max_tokens
(or the full context) as "length", count usage, and say the prompt's length on the first
token. `token_loop` does that; the engine supplies only how to get the next token id, its
bytes, and which ids end a generation.

A served engine (llama-server, vLLM) gets finished text from its server, which applies the
stop strings and max_tokens itself; what it shares is the relay: check cancellation
between events, end at the token that carries a finish reason, and fail typed when the
server ends the stream without one. `relay_served` does that; the engine supplies only how
one line of its stream becomes tokens.

This is the decode hot path: no allocation per token beyond the token itself (the first
token and the last are rebuilt once, for their extra fields). It never touches an engine
library, so it is tested with a scripted token source (tests/worker/engines/test_token_loop.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TypeVar

from skulk.shared.types.common import FinishReason, Usage
from skulk.worker.engines.base import (
    EngineError,
    GeneratedToken,
    StopStringFilter,
    Utf8StreamDecoder,
    usage_of,
)

Line = TypeVar("Line", str, bytes)

TokenMaker = Callable[[str, int, FinishReason | None, Usage | None], GeneratedToken]
"""How one output token is built from (text, token id, finish reason, usage): plain
`GeneratedToken`, or an engine's logprob-carrying subclass when the request asked."""


def max_new_tokens(max_tokens: int | None, n_prompt: int, n_ctx: int) -> int:
    """The most tokens a request may generate: its max_tokens, within the context's room."""
    room = n_ctx - n_prompt
    return min(max_tokens, room) if max_tokens is not None else room


def token_loop(
    next_token: Callable[[], int],
    token_bytes: Callable[[int], bytes],
    is_end: Callable[[int], bool],
    *,
    n_prompt: int,
    max_new: int,
    stop: Sequence[str],
    cancelled: threading.Event,
    cached: int = 0,
    make: TokenMaker = GeneratedToken,
    announce_prompt: bool = True,
    first: Callable[[GeneratedToken], GeneratedToken] | None = None,
) -> Iterator[GeneratedToken]:
    """Sampled token ids to client tokens, until a finish or the caller's cancellation.

    `next_token()` samples the next id (it may block; it is called again only after the
    previous token was consumed, so `make` can still read that token's logits). A cancelled
    request ends silently: the caller went away, there is nobody to tell. `cached`: prompt
    tokens served from a cache (usage's cached count). `announce_prompt`: the first token
    carries `prompt_tokens` (False where the engine already said it, on a think-open token).
    `first`: a last touch on the first token (prompt logprobs)."""
    decode = Utf8StreamDecoder().decode
    stops = StopStringFilter(stop)
    push = stops.push  # bound once: the loop runs once per sampled token
    completion = 0
    while True:
        token = next_token()
        if cancelled.is_set():
            return
        completion += 1
        if is_end(token):
            out = make(stops.flush(), token, "stop", usage_of(n_prompt, completion, cached))
        else:
            piece, matched = push(decode(token_bytes(token)))
            if matched:
                out = replace(make(piece, token, "stop", usage_of(n_prompt, completion, cached)),
                              stop_sequence=stops.matched)
            elif completion >= max_new:
                # max_tokens reached, or the context is full: either way "length".
                out = make(piece + stops.flush(), token, "length", usage_of(n_prompt, completion, cached))
            else:
                out = make(piece, token, None, None)
        if completion == 1:
            if announce_prompt:
                out = replace(out, prompt_tokens=n_prompt)
            if first is not None:
                out = first(out)
        yield out
        if out.finish_reason is not None:
            return


def relay_served(
    lines: Iterable[Line],
    tokens_of: Callable[[Line], Iterable[GeneratedToken]],
    cancelled: threading.Event,
    *,
    unfinished: str,
    at_end: Callable[[], GeneratedToken | None] = lambda: None,
) -> Iterator[GeneratedToken]:
    """A served engine's stream lines to client tokens, ending at the token that carries a
    finish reason.

    Cancellation is checked between lines: returning closes the caller's response, and the
    server frees the request's slot. `at_end()`: a token held back until the stream ends
    (vLLM sends usage after the finish). A stream that ends without a finish, uncancelled,
    is an `EngineError(unfinished)`: a client must never read a cut answer as whole."""
    for line in lines:
        if cancelled.is_set():
            return
        for token in tokens_of(line):
            yield token
            if token.finish_reason is not None:
                return
    held = at_end()
    if held is not None:
        yield held
        return
    if not cancelled.is_set():
        raise EngineError(unfinished)


__all__ = ["TokenMaker", "max_new_tokens", "relay_served", "token_loop"]
