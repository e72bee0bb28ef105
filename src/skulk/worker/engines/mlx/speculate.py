"""Speculation on one MLX rank: draft from the context (prompt lookup, `ngram`) or with a
draft model (`draft`, `mlx.draft_model`), check the draft in one forward step, keep what the
model agrees with, and give the KV cache back what it rejected.

`Speculation` is one request's drafting state: the context drafts are looked up in (the
prompt and every token emitted so far), the tokens already verified but not yet handed to the
token loop, and the drafted and accepted counts for the request's usage. `next_token` has the
same contract as the engine's plain step (one sampled id per call; the last one is fed to the
model on the next call), so the token loop, stop strings and `max_tokens` are unchanged; a
step whose context has no match is a plain one-token step.

The cache always holds exactly the tokens fed to the model (`fed`): the verified drafts
stay, the rejected ones are trimmed, and the token sampled after the last kept draft is fed
on the next step. Only whole-model single ranks speculate (the engine refuses the rest at
load; the whole model or all its layers), with plain sampling (a request with a shaped sampler steps one token at a time).
The drafter is a function of the context and the room left (`Drafter`); both drafters
propose deterministically, so keeping the drafts the model's own draws agree with is the
standard acceptance rule and sampled output keeps the model's distribution.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from skulk.shared.types.engines import traits_of
from skulk.worker.engines.base import GeneratedToken, ModelLoadFailed
from skulk.worker.engines.mlx.pipeline import Stage, embed_tokens, forward_layers
from skulk.worker.engines.mlx.sampling import Sampler
from skulk.worker.engines.ngram_draft import DRAFT_TOKENS, accepted, propose


def speculating(method: str | None, world: int, make_cache: Callable[[], list[Any]]) -> bool:
    """Whether a model placed with `method` (the card's `runtime.speculative`) drafts here;
    `ModelLoadFailed` naming the reason where the card's speculation cannot be honoured
    (placement keeps a speculating card on one node, so this is a last guard)."""
    if (method or "none") == "none":
        return False
    served = traits_of("mlx").speculative
    if method not in served:
        raise ModelLoadFailed(f"the MLX engine drafts with {', '.join(map(repr, served))} only, not {method!r}")
    if world > 1:
        raise ModelLoadFailed(f"{method} speculation runs on one MLX rank holding the whole model")
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    # A plain cache (or its quantized form) can always give back its last positions; a
    # rotating window cannot once it has wrapped, which happens mid-request (mlx-lm then trims
    # nothing, silently).
    if not all(type(layer) is KVCache or isinstance(layer, QuantizedKVCache) for layer in make_cache()):
        raise ModelLoadFailed("this model's KV cache cannot always give back rejected drafts (a rotating window "
                              "or another non-plain cache): place it without runtime.speculative")
    return True


Drafter = Callable[[list[int], int], list[int]]
"""`drafter(context, room)`: up to `room` tokens proposed to follow `context` ([] for none)."""


def prompt_lookup(context: list[int], room: int) -> list[int]:
    """The `ngram` drafter: what followed the context's tail earlier in it."""
    return propose(context, min(DRAFT_TOKENS, room))


def with_draft_counts(tokens: Iterator[GeneratedToken], drafting: Speculation) -> Iterator[GeneratedToken]:
    """`tokens`, the one carrying the usage with the request's drafted and accepted counts."""
    for token in tokens:
        if token.usage is not None:
            token = replace(token, usage=token.usage.model_copy(update={
                "drafted_tokens": drafting.drafted, "accepted_draft_tokens": drafting.accepted}))
        yield token


def verify(stage: Stage, cache: list[Any], sampler: Sampler, tokens: Sequence[int]) -> list[int]:
    """The model's own token after each of `tokens` (fed in one step, extending `cache`): the
    whole mlx-lm model, or a one-rank stage's embedding, layers and head over every position."""
    import mlx.core as mx

    ids = mx.array(list(tokens), dtype=mx.int32)
    if stage.whole is not None:
        logits = stage.whole(ids[None], cache=cache)[0]
    else:
        assert stage.norm is not None and stage.head is not None  # one rank holds them
        logits = stage.head(stage.norm(forward_layers(stage, embed_tokens(stage, ids), cache)))[0]
    if sampler.params.greedy:
        chosen = mx.argmax(logits, axis=-1)
    else:  # one draw per position, in order, as plain decoding would draw them
        chosen = mx.concatenate([sampler(logits[i]) for i in range(len(tokens))])
    mx.eval(chosen)
    return [int(t) for t in cast("list[int]", chosen.tolist())]


def trim(cache: list[Any], count: int) -> None:
    """Drop the last `count` positions of every layer's cache (the rejected drafts)."""
    if count:
        from mlx_lm.models.cache import trim_prompt_cache

        trim_prompt_cache(cache, count)


@dataclass
class Speculation:
    """One request's drafting (see the module doc)."""

    context: list[int]
    """The prompt, then every token handed to the token loop."""
    max_new: int
    drafter: Drafter = prompt_lookup
    drafted: int = 0
    accepted: int = 0
    _pending: deque[int] = field(default_factory=deque)
    _handed: int = 0

    def next_token(self, fed: int, step: Callable[[int], int], check: Callable[[list[int]], list[int]],
                   feed: Callable[[list[int]], None], drop: Callable[[int], None]) -> int:
        """The next token after `fed` (the last token handed out, not yet in the cache).
        `step(fed)`: a plain step's token. `check(tokens)`: the model's token after each
        (fed and the drafts, in one step). `feed(tokens)`: the tokens now in the cache (the
        prefix store's hot tokens). `drop(n)`: trim the cache's last n positions."""
        if self._pending:
            return self.handed(self._pending.popleft())
        room = self.max_new - self._handed - 1  # the token after the drafts is handed out too
        drafts = self.drafter(self.context, room) if room > 0 else []
        if not drafts:
            feed([fed])
            return self.handed(step(fed))
        sampled = check([fed, *drafts])
        kept = accepted(drafts, sampled)
        drop(len(drafts) - kept)
        feed([fed, *drafts[:kept]])
        self.drafted += len(drafts)
        self.accepted += kept
        self._pending.extend([*drafts[1:kept], sampled[kept]] if kept else [])
        return self.handed(drafts[0] if kept else sampled[0])

    def handed(self, token: int) -> int:
        """`token`, recorded as handed to the token loop (the prefill's token goes through here)."""
        self.context.append(token)
        self._handed += 1
        return token


__all__ = ["Drafter", "Speculation", "prompt_lookup", "speculating", "trim", "verify", "with_draft_counts"]
