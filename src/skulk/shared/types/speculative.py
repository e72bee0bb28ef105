"""Speculative decoding: which method a model is served with, and which engines can.

A drafter proposes several tokens; the target model checks them all in one step and keeps
the ones it would have chosen itself, so the output is what it would be without drafting
(greedy output identical, sampling unchanged in distribution) and a step can yield several
tokens. `ngram` drafts from n-grams already in the context: no second model, no extra
memory, and a large gain on output that copies its prompt (code edits, summaries that quote)
or repeats itself; little on free prose. It is llama-server's `--spec-type ngram-simple` and
vLLM's n-gram `--speculative-config`.
`draft` runs a small model of the same tokenizer (the card's `served_spec_draft_*`
companion, downloaded only for such a card and admitted for memory with the target) ahead
of the target: llama-server's `--spec-type draft-simple --model-draft`. It pays off where
the draft is much cheaper than the target and usually agrees with it.

A card chooses it (`runtime.speculative`); placement serves such a card only on an engine
that can (`speculative_refusal`), and refuses it by name where none can. Drafted and
accepted counts come back in `Usage` and `/metrics`. Pure; data and functions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

from skulk.shared.types.engines import traits_of

SpeculativeMethod = Literal["none", "ngram", "draft"]

LLAMA_SERVER_SPEC_TYPES: Mapping[str, str] = MappingProxyType({"ngram": "ngram-simple", "draft": "draft-simple"})
"""Method -> llama-server's `--spec-type` value."""

VLLM_SPECULATIVE_CONFIGS: Mapping[str, Mapping[str, object]] = MappingProxyType({
    "ngram": MappingProxyType({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                               "prompt_lookup_min": 2}),
})
"""Method -> vLLM's `--speculative-config`: prompt lookup drafts up to 4 tokens from the
longest 2..4-gram of the context that matches its tail (vLLM's documented n-gram setup)."""


def request_refusal(method: str | None, asked: bool | None) -> str | None:
    """Why a request's `speculative` cannot be honoured for a model placed with `method`
    (the card's `runtime.speculative`), or None. llama-server and vLLM take the drafting
    setup at start (this llama.cpp build compiles its per-request speculative parameters
    out), so a request can only ask for what the model is served with."""
    drafting = (method or "none") != "none"
    if asked is None or asked == drafting:
        return None
    if drafting:
        return (f"is served with {method} speculation, fixed when its engine starts; a request cannot turn it "
                "off (the output is the same either way)")
    return "is served without speculation (its card's runtime.speculative); a request cannot turn it on"


def speculative_refusal(backend: str, method: str) -> str | None:
    """Why a shard on `backend` (a backend tag) cannot serve with `method`, or None."""
    if method == "none":
        return None
    engine = backend.partition("-")[0]
    if method not in traits_of(engine).speculative:
        served = ", ".join(traits_of(engine).speculative) or "none"
        return f"the {engine} engine serves speculative methods: {served} (runtime.speculative is {method!r})"
    return None


__all__ = ["LLAMA_SERVER_SPEC_TYPES", "VLLM_SPECULATIVE_CONFIGS", "SpeculativeMethod", "request_refusal", "speculative_refusal"]
