"""Choosing the next token from logits, identically on every rank that samples.

Greedy when the temperature is 0; otherwise temperature, then top-k, then top-p (nucleus)
filtering and a categorical draw from a PRNG key derived from the request's seed. The key
advances by splitting once per sampled token, so two ranks given the same seed and the same
logits draw the same token: that is what lets every tensor rank sample for itself, and it
makes a seeded request reproducible. Rank 0 draws a seed when the request has none and
broadcasts it, so "unseeded" never means "ranks disagree".

`resolve_sampling` is pure; `Sampler` builds lazy MLX graphs and never evaluates them (the
caller evaluates under its watchdog).

A request that asks for more than temperature/top-k/top-p (logprobs, logit bias, penalties, a
grammar for a forced tool call or a response format) is sampled by a `TokenChooser` on rank 0
instead: the logits row goes to numpy, `skulk.worker.engines.logits` shapes it exactly as the
llama.cpp engine does (bias, penalties, grammar mask), the same seeded `Sampler` draws from
it, and the token is accepted at once (grammar advanced, history and scores recorded). Only
rank 0 holds the tokenizer, so only instances whose rank 0 computes the logits (one rank, or
a tensor group) serve those features; a pipeline group's last rank samples, and is refused
them by the engine traits table.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from skulk.shared.sampling_defaults import DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P
from skulk.shared.tool_grammar import SchemaNotSupported, request_grammar, request_json_schema
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.logits import (
    PENALTY_LAST_N,
    GrammarMatcher,
    GrammarRejected,
    Scores,
    apply_bias,
    apply_penalties,
    check_bias_ids,
    log_softmax_at,
)

DEFAULT_MIN_P = 0.0
"""Used when a request leaves a knob unset: the same defaults as the llama.cpp engine, so a
request means the same thing whichever engine serves it."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float
    top_k: int
    seed: int
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def resolve_sampling(
    temperature: float | None, top_p: float | None, top_k: int | None, seed: int | None, fresh_seed: int,
    min_p: float | None = None,
) -> SamplingParams:
    """Fill unset knobs with the defaults; `fresh_seed` (drawn by the caller) stands in for
    a missing seed. Seeds are kept to 31 bits so they travel in an int32 header."""
    return SamplingParams(
        temperature=DEFAULT_TEMPERATURE if temperature is None else float(temperature),
        top_p=DEFAULT_TOP_P if top_p is None else float(top_p),
        top_k=DEFAULT_TOP_K if top_k is None else int(top_k),
        seed=(fresh_seed if seed is None else seed) & 0x7FFFFFFF,
        min_p=DEFAULT_MIN_P if min_p is None else float(min_p),
    )


class Sampler:
    """Per-request sampling state (the PRNG key)."""

    def __init__(self, params: SamplingParams) -> None:
        import mlx.core as mx

        self.params = params
        self._key = None if params.greedy else mx.random.key(params.seed)

    def __call__(self, logits: Any) -> Any:
        """A lazy int32 array of shape (1,) holding the chosen token."""
        import mlx.core as mx

        if self.params.greedy:
            return mx.argmax(logits, axis=-1).astype(mx.int32).reshape(1)
        assert self._key is not None  # drawn in __init__ whenever sampling is not greedy
        keys = mx.random.split(self._key)
        self._key, draw = keys[0], keys[1]
        scaled = logits.astype(mx.float32) / self.params.temperature
        vocab = scaled.shape[-1]
        if 0 < self.params.top_k < vocab:
            kth = mx.sort(scaled)[vocab - self.params.top_k]
            scaled = mx.where(scaled < kth, -mx.inf, scaled)
        if self.params.top_p < 1.0:
            probs = mx.softmax(scaled, axis=-1)
            ordered = mx.sort(probs)[::-1]
            before = mx.cumsum(ordered) - ordered  # mass strictly above each candidate
            # The smallest probability still inside the nucleus; the top token always is.
            floor = mx.min(mx.where(before < self.params.top_p, ordered, mx.inf))
            scaled = mx.where(probs < floor, -mx.inf, scaled)
        if self.params.min_p > 0.0:
            probs = mx.softmax(scaled, axis=-1)
            scaled = mx.where(probs < self.params.min_p * mx.max(probs), -mx.inf, scaled)
        return mx.random.categorical(scaled, key=draw).astype(mx.int32).reshape(1)


@dataclass(frozen=True)
class Shaping:
    """What a request does to the logits besides temperature/top-k/top-p. `top_logprobs`
    None: no logprobs wanted (0: only the chosen token's)."""

    logit_bias: Mapping[int, float] = field(default_factory=dict)
    repeat: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    grammar: str | None = None
    """The JSON Schema (as JSON text) the output must be an instance of, or None."""
    top_logprobs: int | None = None

    @property
    def penalised(self) -> bool:
        return self.repeat != 1.0 or self.frequency != 0.0 or self.presence != 0.0

    @property
    def idle(self) -> bool:
        """Nothing to do beyond plain sampling: the lazy MLX path serves it unchanged."""
        return not self.logit_bias and not self.penalised and self.grammar is None and self.top_logprobs is None


def shaping_of(request: TextGenerationParams) -> Shaping:
    """The request's logit shaping. `GrammarRejected` for a schema no grammar can enforce
    (the API refuses it before dispatch with the keyword; this is the engine's guard)."""
    try:
        # The GBNF compile refuses what no engine enforces, so MLX refuses alike; llguidance
        # then constrains by the equivalent JSON Schema (its JSON path masks a token in tens
        # of microseconds, where a char-level GBNF grammar costs milliseconds).
        request_grammar(request.tools, request.tool_choice, request.response_format)
    except SchemaNotSupported as exc:
        raise GrammarRejected(str(exc)) from exc
    schema = request_json_schema(request.tools, request.tool_choice, request.response_format)
    grammar = None if schema is None else json.dumps(schema)
    return Shaping(
        logit_bias=dict(request.logit_bias),
        repeat=1.0 if request.repeat_penalty is None else float(request.repeat_penalty),
        frequency=float(request.frequency_penalty or 0.0),
        presence=float(request.presence_penalty or 0.0),
        grammar=grammar,
        top_logprobs=(request.top_logprobs or 0) if request.logprobs else None,
    )


class TokenChooser:
    """Rank 0's sampler for a shaped request: numpy shaping, the request's seeded `Sampler`,
    and immediate acceptance. Called with one row of raw logits, never log-probabilities
    (llama.cpp's repeat penalty treats positive and negative logits differently); returns the
    token as an evaluated int32 array of shape (1,), like `Sampler`. Scores of each accepted
    token queue up in order for the requester (`pop_scores`), which may run on another
    thread (the batch loop)."""

    def __init__(self, sampler: Sampler, shaping: Shaping, vocab_size: int,
                 grammar_factory: Callable[[str], GrammarMatcher] | None = None) -> None:
        check_bias_ids(shaping.logit_bias, vocab_size)
        self.sampler = sampler
        self.shaping = shaping
        self._matcher = None
        if shaping.grammar is not None:
            if grammar_factory is None:
                raise GrammarRejected("this engine has no grammar support loaded")
            self._matcher = grammar_factory(shaping.grammar)
        self._recent: deque[int] = deque(maxlen=PENALTY_LAST_N)
        self._scores: deque[Scores] = deque()
        self._lock = threading.Lock()

    def __call__(self, logits: Any) -> Any:
        import mlx.core as mx
        import numpy as np

        shaping = self.shaping
        raw = np.array(logits.astype(mx.float32), copy=True).reshape(-1)
        shaped = raw.copy()
        apply_bias(shaped, shaping.logit_bias)
        if shaping.penalised:
            apply_penalties(shaped, self._recent, repeat=shaping.repeat, frequency=shaping.frequency,
                            presence=shaping.presence)
        if self._matcher is not None:
            self._matcher.mask(shaped)
        token_array = self.sampler(mx.array(shaped))
        mx.eval(token_array)
        token = int(token_array.item())
        if self._matcher is not None:
            self._matcher.consume(token)
        self._recent.append(token)
        if shaping.top_logprobs is not None:
            with self._lock:
                self._scores.append(log_softmax_at(raw, token, shaping.top_logprobs))
        return token_array

    def pop_scores(self) -> Scores | None:
        """The oldest accepted token's scores not yet taken (None without logprobs)."""
        with self._lock:
            return self._scores.popleft() if self._scores else None


__all__ = [
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TOP_K",
    "DEFAULT_TOP_P",
    "Sampler",
    "SamplingParams",
    "Scores",
    "Shaping",
    "TokenChooser",
    "resolve_sampling",
    "shaping_of",
]
