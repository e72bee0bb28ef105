"""Prompt-lookup drafting: the draft an engine checks in one step, taken from its own context.

The last `n` tokens of the context (n from `max_ngram` down to `min_ngram`) are looked up at
their most recent earlier occurrence; the tokens that followed it there are the draft. Output
that copies its prompt (a code edit, a quoting summary) or repeats itself hits often and
drafts long runs; free prose rarely hits, and then nothing is drafted and the step is a plain
one. This is what llama-server's `ngram-simple` and vLLM's n-gram method do, for the engines
that draft inside Skulk (MLX).

`accepted` is the verification rule: the target samples its own token at every drafted
position, and the draft is kept while it agrees. Each kept token is then exactly what the
target would have produced (greedy: identical text; sampling: the same distribution, since
every emitted token is drawn from the target given the tokens before it). Pure: lists in,
lists out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

MAX_NGRAM: Final = 4
MIN_NGRAM: Final = 2
DRAFT_TOKENS: Final = 4
"""Drafted tokens per step: the n-gram setup vLLM documents (up to 4 tokens from a 2..4-gram
match). A longer draft costs a wider verification step on every hit, accepted or not."""
LOOKBACK_TOKENS: Final = 8192
"""How far back a match is looked for: the lookup is a linear scan per step, so it is bounded
(a long conversation's most recent 8 K tokens hold the spans worth copying)."""


def propose(context: Sequence[int], limit: int = DRAFT_TOKENS, *, max_ngram: int = MAX_NGRAM,
            min_ngram: int = MIN_NGRAM, lookback: int = LOOKBACK_TOKENS) -> list[int]:
    """Up to `limit` tokens that followed the most recent earlier occurrence of the context's
    last n-gram (the longest n that matches), or [] when none matches."""
    if limit < 1:
        return []
    window = list(context[-lookback:])
    end = len(window)
    for n in range(min(max_ngram, end - 1), min_ngram - 1, -1):
        tail = window[end - n:]
        # The most recent match that is not the tail itself, and that has a token after it.
        for start in range(end - n - 1, -1, -1):
            if window[start:start + n] == tail:
                follow = window[start + n:start + n + limit]
                if follow:
                    return follow
    return []


def accepted(drafts: Sequence[int], sampled: Sequence[int]) -> int:
    """How many drafts the target kept: the length of the run where its own token at each
    drafted position (`sampled[i]`) equals the draft. `sampled` holds one more token than
    `drafts` (the token after the last draft), so the step always yields accepted + 1."""
    if len(sampled) != len(drafts) + 1:
        raise ValueError(f"{len(sampled)} sampled tokens for {len(drafts)} drafts; expected one more")
    kept = 0
    while kept < len(drafts) and drafts[kept] == sampled[kept]:
        kept += 1
    return kept


__all__ = ["DRAFT_TOKENS", "LOOKBACK_TOKENS", "MAX_NGRAM", "MIN_NGRAM", "accepted", "propose"]
