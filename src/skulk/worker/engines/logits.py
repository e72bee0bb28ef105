"""Engine-agnostic logit work over one row of next-token logits (a numpy vector): what a
request's sampling features do to it, written once for every engine that samples itself.

- `log_softmax_at`: the chosen token's log-probability and the most likely alternatives,
  under the model's raw distribution (before bias, penalties, temperature), as OpenAI
  reports `logprobs`.
- `check_bias_ids` / `apply_bias`: OpenAI's `logit_bias` (token id -> offset); an id outside
  the vocabulary is refused, never a silent no-op.
- `apply_penalties`: llama.cpp's penalties sampler (repeat, frequency, presence over the last
  `PENALTY_LAST_N` generated tokens), so an MLX instance penalises exactly as a llama.cpp one.
- `GrammarMatcher`: constrained decoding with llguidance by the JSON Schema of what the
  llama.cpp engine's GBNF grammar allows (`skulk.shared.tool_grammar.request_json_schema`,
  beside `request_grammar`, which both engines run first so they refuse alike): forced tool
  calls and structured output parse and validate on every engine. (llguidance reads GBNF
  too, but a char-level GBNF grammar costs it milliseconds per token where
  its JSON Schema path costs tens of microseconds.)

llguidance was chosen over xgrammar and outlines-core: it is one self-contained wheel (Rust,
abi3) on PyPI for Linux x86_64/aarch64 and macOS with no torch dependency (xgrammar pulls
torch and CUDA libraries on Linux), it compiles JSON Schema (and GBNF) itself, and its
numpy mask API works on any array library.

Pure functions plus one small stateful matcher; no engine library here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from skulk.shared.types.chunks import PromptTokenLogprob, TopLogprob
from skulk.worker.engines.base import EngineError, GeneratedToken

if TYPE_CHECKING:
    from llguidance import GrammarFormat

Scores = tuple[float, list[tuple[int, float]]]
"""A token's logprob and the top alternatives (id, logprob), best first."""

PENALTY_LAST_N = 64
"""How many of the latest generated tokens the penalties look at: llama-cpp-python's
`last_n_tokens_size` default, which the llama.cpp engine runs with."""


@dataclass(frozen=True, slots=True)
class ScoredToken(GeneratedToken):
    """A sampled token with its log-probability under the model (before temperature and
    truncation, as OpenAI reports it) and, when asked for, the most likely alternatives.
    Only produced for requests with `logprobs`; the runner copies the two fields onto the
    TokenChunk."""

    logprob: float | None = None
    top_logprobs: list[TopLogprob] | None = None
    prompt_logprobs: list[PromptTokenLogprob] | None = None
    """On the first token, when the request asked: the prompt's tokens scored."""


class InvalidTokens(EngineError):
    """A token id (an embedding input, a `logit_bias` key) outside this model's vocabulary."""

    error_type = "InvalidRequest"


class GrammarRejected(EngineError):
    """The request's grammar could not be built or compiled by the engine. The API compiles
    the same grammar before dispatch, so this is a guard, not the caller's usual 400."""

    error_type = "InvalidRequest"


def log_softmax_at(logits: np.ndarray, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """log p(token) under softmax(logits), and the `top` most likely (id, logprob), best
    first. One pass of exp over the vocabulary; argpartition keeps top-k linear."""
    peak = float(logits.max())
    log_z = peak + float(np.log(np.exp(logits - peak, dtype=np.float64).sum()))
    chosen = float(logits[token]) - log_z
    if top <= 0:
        return chosen, []
    k = min(top, logits.shape[0])
    ids = np.argpartition(logits, -k)[-k:]
    ids = ids[np.argsort(-logits[ids], kind="stable")]
    return chosen, [(int(i), float(logits[i]) - log_z) for i in ids]


def check_bias_ids(bias: Mapping[int, float], n_vocab: int) -> None:
    """`InvalidTokens` naming the first `logit_bias` id outside [0, n_vocab)."""
    for token in bias:
        if not 0 <= token < n_vocab:
            raise InvalidTokens(f"logit_bias names token id {token}, outside this model's vocabulary "
                                f"(0..{n_vocab - 1})")


def apply_bias(logits: np.ndarray, bias: Mapping[int, float]) -> None:
    """Add `bias` to `logits` in place (ids already checked)."""
    if bias:
        ids = np.fromiter(bias.keys(), dtype=np.intp, count=len(bias))
        logits[ids] += np.fromiter(bias.values(), dtype=logits.dtype, count=len(bias))


def apply_penalties(logits: np.ndarray, recent: Iterable[int], *, repeat: float = 1.0, frequency: float = 0.0,
                    presence: float = 0.0) -> None:
    """llama.cpp's penalties, in place, for every token seen in `recent` (the caller passes
    the last `PENALTY_LAST_N`): a positive logit divided by `repeat`, a negative one
    multiplied by it; then `frequency` times the token's count and `presence` once
    subtracted."""
    counts: dict[int, int] = {}
    for token in recent:
        counts[token] = counts.get(token, 0) + 1
    if not counts:
        return
    ids = np.fromiter(counts.keys(), dtype=np.intp, count=len(counts))
    seen = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
    values = logits[ids]
    if repeat != 1.0:
        values = np.where(values > 0, values / repeat, values * repeat)
    values = values - seen * frequency - (seen > 0) * presence
    logits[ids] = values


def with_prompt_logprobs(token: GeneratedToken, entries: list[PromptTokenLogprob]) -> ScoredToken:
    """`token` (the first of a generation) carrying the scored prompt."""
    if isinstance(token, ScoredToken):
        return replace(token, prompt_logprobs=entries)
    plain = {f.name: getattr(token, f.name) for f in fields(GeneratedToken)}
    return ScoredToken(**plain, prompt_logprobs=entries)


def prompt_entries(prompt: Sequence[int], scores: Sequence[Scores], token_text: Any,
                   skip_first: bool) -> list[PromptTokenLogprob]:
    """The scored prompt as wire entries: `scores[j]` scores `prompt[j + 1]` given the
    tokens before it; the first token has no logprob (nothing precedes it), and is left out
    when `skip_first` (a BOS the engine added, which is not the caller's text)."""
    entries = []
    for j, token in enumerate(prompt):
        if j == 0 and skip_first:
            continue
        chosen, best = scores[j - 1] if j > 0 else (None, [])
        entries.append(PromptTokenLogprob(
            token=token_text(token), token_id=token, logprob=chosen,
            top_logprobs=[TopLogprob(token=token_text(i), logprob=lp, token_id=i) for i, lp in best]))
    return entries


def top_logprobs_of(logits: np.ndarray, token: int, top: int, token_text: Any) -> tuple[float, list[TopLogprob]]:
    """`log_softmax_at` with the alternatives as wire `TopLogprob`s; `token_text(id)` is the
    engine's text of one token."""
    chosen, best = log_softmax_at(logits, token, top)
    return chosen, [TopLogprob(token=token_text(i), logprob=lp, token_id=i) for i, lp in best]


class GrammarMatcher:
    """One request's constrained-decoding state: which tokens may come next under a grammar
    (`grammar_format` "json_schema": JSON Schema text; "gbnf": a GBNF grammar), advanced by
    each sampled token. Built from an llguidance tokenizer (built once per model,
    `llguidance_tokenizer`)."""

    def __init__(self, tokenizer: Any, grammar: str, grammar_format: GrammarFormat = "json_schema") -> None:
        import llguidance

        try:
            self._matcher = llguidance.LLMatcher(tokenizer, llguidance.grammar_from(grammar_format, grammar))
        except Exception as exc:  # llguidance raises ValueError for a grammar it cannot read
            raise GrammarRejected(f"llguidance could not compile the request's grammar: {exc}") from exc
        if self._matcher.is_error():
            raise GrammarRejected(f"llguidance could not compile the request's grammar: {self._matcher.get_error()}")
        self._n_vocab = int(tokenizer.vocab_size)
        self._bitmask = np.full(((self._n_vocab + 31) // 32,), -1, dtype=np.int32)

    def allowed(self, width: int) -> np.ndarray:
        """A bool vector of `width` (the logits' width, which may exceed the tokenizer's
        vocabulary): True where a token may come next."""
        self._matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[: self._n_vocab].astype(bool)
        if width > self._n_vocab:
            bits = np.concatenate([bits, np.zeros(width - self._n_vocab, dtype=bool)])
        return bits[:width]

    def mask(self, logits: np.ndarray) -> None:
        """Set every token the grammar forbids next to -inf, in place."""
        logits[~self.allowed(logits.shape[0])] = -np.inf

    def consume(self, token: int) -> None:
        """Advance by the sampled token (it was allowed, so this cannot fail unless the
        engine sampled outside the mask)."""
        if not self._matcher.consume_token(token):
            raise GrammarRejected(f"token {token} was sampled outside the grammar: {self._matcher.get_error()}")


def llguidance_tokenizer(hf_tokenizer: Any, eos_ids: Sequence[int]) -> Any:
    """llguidance's view of a Hugging Face fast tokenizer (about a second for a large
    vocabulary: build once per loaded model)."""
    import llguidance.hf

    return llguidance.hf.from_tokenizer(hf_tokenizer, eos_token=list(eos_ids) or None)


__all__ = [
    "PENALTY_LAST_N",
    "GrammarMatcher",
    "GrammarRejected",
    "InvalidTokens",
    "ScoredToken",
    "Scores",
    "apply_bias",
    "apply_penalties",
    "check_bias_ids",
    "llguidance_tokenizer",
    "log_softmax_at",
    "prompt_entries",
    "top_logprobs_of",
    "with_prompt_logprobs",
]
