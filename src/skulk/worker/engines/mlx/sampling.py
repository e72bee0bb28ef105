"""Choosing the next token from logits, identically on every rank that samples.

Greedy when the temperature is 0; otherwise temperature, then top-k, then top-p (nucleus)
filtering and a categorical draw from a PRNG key derived from the request's seed. The key
advances by splitting once per sampled token, so two ranks given the same seed and the same
logits draw the same token: that is what lets every tensor rank sample for itself, and it
makes a seeded request reproducible. Rank 0 draws a seed when the request has none and
broadcasts it, so "unseeded" never means "ranks disagree".

`resolve_sampling` is pure; `Sampler` builds lazy MLX graphs and never evaluates them (the
caller evaluates under its watchdog).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_P = 0.95
DEFAULT_TOP_K = 40
"""Used when a request leaves a knob unset: the same defaults as the llama.cpp engine, so a
request means the same thing whichever engine serves it."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float
    top_k: int
    seed: int

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def resolve_sampling(
    temperature: float | None, top_p: float | None, top_k: int | None, seed: int | None, fresh_seed: int
) -> SamplingParams:
    """Fill unset knobs with the defaults; `fresh_seed` (drawn by the caller) stands in for
    a missing seed. Seeds are kept to 31 bits so they travel in an int32 header."""
    return SamplingParams(
        temperature=DEFAULT_TEMPERATURE if temperature is None else float(temperature),
        top_p=DEFAULT_TOP_P if top_p is None else float(top_p),
        top_k=DEFAULT_TOP_K if top_k is None else int(top_k),
        seed=(fresh_seed if seed is None else seed) & 0x7FFFFFFF,
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
        return mx.random.categorical(scaled, key=draw).astype(mx.int32).reshape(1)


__all__ = ["DEFAULT_TEMPERATURE", "DEFAULT_TOP_K", "DEFAULT_TOP_P", "Sampler", "SamplingParams", "resolve_sampling"]
