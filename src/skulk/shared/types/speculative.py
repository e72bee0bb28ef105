"""Speculative decoding: which method a model is served with, and which engines can.

A drafter proposes several tokens; the target model checks them all in one step and keeps
the ones it would have chosen itself, so the output is what it would be without drafting
(greedy output identical, sampling unchanged in distribution) and a step can yield several
tokens. `ngram` drafts from n-grams already in the context: no second model, no extra
memory, and a large gain on output that copies its prompt (code edits, summaries that quote)
or repeats itself; little on free prose. It is llama-server's `--spec-type ngram-simple`.

A card chooses it (`runtime.speculative`); placement serves such a card only on an engine
that can (`speculative_refusal`), and refuses it by name where none can. Drafted and
accepted counts come back in `Usage` and `/metrics`. Pure; data and functions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from skulk.shared.types.engines import traits_of

SpeculativeMethod = Literal["none", "ngram"]

LLAMA_SERVER_SPEC_TYPES: Mapping[str, str] = MappingProxyType({"ngram": "ngram-simple"})
"""Method -> llama-server's `--spec-type` value."""


def speculative_refusal(backend: str, method: str) -> str | None:
    """Why a shard on `backend` (a backend tag) cannot serve with `method`, or None."""
    if method == "none":
        return None
    engine = backend.partition("-")[0]
    if method not in traits_of(engine).speculative:
        served = ", ".join(traits_of(engine).speculative) or "none"
        return f"the {engine} engine serves speculative methods: {served} (runtime.speculative is {method!r})"
    return None


__all__ = ["LLAMA_SERVER_SPEC_TYPES", "SpeculativeMethod", "speculative_refusal"]
