"""Draft-model speculation on one MLX rank: a small mlx-lm model of the target's tokenizer
proposes the next few tokens (`runtime.speculative = "draft"`, the card's
`served_spec_draft_repo` companion, a safetensors repo).

`DraftModel.propose(context, room)` is the drafter `mlx.speculate.Speculation` asks each step
(as it asks prompt lookup for `ngram`): the draft model's greedy continuation of `context`.
The draft keeps its own KV cache and the tokens in it (`fed`); before drafting it gives back
the positions where `fed` and the context part (the drafts the target rejected, or another
request's tokens) and feeds what the context has beyond them, so a request's prompt is fed
once and a later request with the same prefix reuses it.

The drafts are greedy: a deterministic proposal, so the target's verification (its own draw
at every drafted position, the drafts kept while they match: `speculate.verify`) is the
standard acceptance rule for a point-mass draft (accept with probability p(draft), else
draw from p without the draft), and sampled output keeps the target's distribution exactly;
greedy output is the target's own.

This module never touches the target's cache and never decides how many tokens a request
may still take (the caller's `room`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Final, cast

from skulk.worker.engines.base import ModelLoadFailed

log = logging.getLogger(__name__)

DRAFT_MODEL_TOKENS: Final = 4
"""Tokens the draft model proposes per step: as many as prompt lookup drafts
(`ngram_draft.DRAFT_TOKENS`). Each costs a draft forward step, and a wider verification
step of the target; a draft that agrees well pays for more, one that rarely does for fewer."""


def common_prefix(fed: list[int], context: list[int]) -> int:
    """How many leading tokens `fed` and `context` share."""
    shared = 0
    for a, b in zip(fed, context, strict=False):
        if a != b:
            break
        shared += 1
    return shared


class DraftModel:
    """A loaded draft model with its own KV cache (see the module doc)."""

    def __init__(self, model: Any, make_cache: Any, prefill_chunk_tokens: int) -> None:
        self._model: Any = model
        self._make_cache = make_cache
        self._cache: list[Any] = make_cache()
        self._prefill_chunk_tokens = prefill_chunk_tokens
        self.fed: list[int] = []
        """The tokens in the draft's cache, in order."""

    @classmethod
    def load(cls, path: str | None, target_vocab_size: int, prefill_chunk_tokens: int) -> DraftModel:
        """The draft at `path` (an mlx-lm model directory); `ModelLoadFailed` naming why it
        cannot draft for a target of `target_vocab_size` tokens."""
        from mlx_lm.models.cache import KVCache, make_prompt_cache
        from mlx_lm.utils import load_config, load_model

        if path is None or not (Path(path) / "config.json").is_file():
            raise ModelLoadFailed(f"the draft model (served_spec_draft_repo) is not on this node as an MLX model "
                                  f"directory ({path or 'not resolved'})")
        config = load_config(Path(path))
        vocab = int(config.get("vocab_size") or 0)
        if target_vocab_size and vocab != target_vocab_size:
            raise ModelLoadFailed(f"the draft model at {path} has a vocabulary of {vocab} tokens, the target "
                                  f"{target_vocab_size}: a draft must share the target's tokenizer")
        try:
            model, _ = load_model(Path(path))
        except Exception as exc:
            raise ModelLoadFailed(f"mlx-lm could not load the draft model {path}: {exc}") from exc

        def make_cache() -> list[Any]:
            return make_prompt_cache(model)

        # Rejected drafts are given back by trimming; only a plain cache always can.
        if not all(type(layer) is KVCache for layer in make_cache()):
            raise ModelLoadFailed(f"the draft model at {path} has a KV cache that cannot always give back "
                                  "rejected drafts (a rotating window or another non-plain cache)")
        return cls(model, make_cache, prefill_chunk_tokens)

    def propose(self, context: list[int], room: int) -> list[int]:
        """Up to `room` (at most `DRAFT_MODEL_TOKENS`) greedy tokens after `context`."""
        count = min(DRAFT_MODEL_TOKENS, room)
        if count < 1 or not context:
            return []
        try:
            return self._propose(context, count)
        except Exception:
            # A step failed part-way: what the cache holds is no longer known.
            self._cache, self.fed = self._make_cache(), []
            raise

    def _propose(self, context: list[int], count: int) -> list[int]:
        import mlx.core as mx
        from mlx_lm.models.cache import trim_prompt_cache

        # At least the context's last token is fed again: its logits give the first draft.
        keep = min(common_prefix(self.fed, context), len(context) - 1)
        if len(self.fed) > keep:
            trim_prompt_cache(self._cache, len(self.fed) - keep)
            del self.fed[keep:]
        pending = context[keep:]
        logits: Any = None
        for start in range(0, len(pending), self._prefill_chunk_tokens):
            chunk = pending[start:start + self._prefill_chunk_tokens]
            logits = self._model(mx.array(chunk, dtype=mx.int32)[None], cache=self._cache)[0, -1]
            mx.eval(logits)
            self.fed.extend(chunk)
        drafts = [_greedy(logits)]
        while len(drafts) < count:
            logits = self._model(mx.array(drafts[-1:], dtype=mx.int32)[None], cache=self._cache)[0, -1]
            self.fed.append(drafts[-1])
            drafts.append(_greedy(logits))
        return drafts

    def close(self) -> None:
        self._cache, self.fed, self._model = [], [], None


def _greedy(logits: Any) -> int:
    """The most likely token of one position's logits (vocab,)."""
    import mlx.core as mx

    return int(cast("int", mx.argmax(logits).item()))


__all__ = ["DRAFT_MODEL_TOKENS", "DraftModel", "common_prefix"]
