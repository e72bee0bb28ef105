"""Which cached KV prefix a prompt re-uses, and what the cold store keeps: the pure policy.

An engine holds one *hot* token sequence in its context (its KV is live) and a bounded
*cold* store of earlier sequences' KV saved to host RAM. Chat clients and coding agents
resend the whole conversation every turn, and several conversations interleave, so the
prompt of a turn usually extends one of those sequences. `choose_prefix` says which one to
start from (the hot one unless a cold one covers clearly more of the prompt) and whether the
hot sequence must be saved first because the request is about to overwrite it; `admit`
says what the cold store keeps once a new entry arrives: entries the new one supersedes (a
prefix of it) go, then the least recently used until the bytes fit `budget_bytes`.

Pure: token tuples and sizes in, decisions out. The engines (`llama_cpp`, `mlx_engine`) do
the copying of KV bytes; this module never sees them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from skulk.shared.settings import setting

COLD_BUDGET_ENV = "SKULK_KV_COLD_BUDGET_MB"
"""Host-RAM MiB per runner for cold KV prefixes; 0 turns the cold store off."""

DEFAULT_COLD_BUDGET_BYTES = 256 * 1024 * 1024
"""Enough for a handful of long conversations of a small model, small against any node's
RAM; the capacity planner's `cold_budget_bytes` (or the setting) overrides it."""

MIN_SAVED_TOKENS = 16
"""The hot sequence is saved only when a request would drop at least this many of its
tokens: fewer are cheaper to recompute than to copy out and back."""

MIN_RESTORE_GAIN = 8
"""A cold entry must cover this many more prompt tokens than the hot sequence to be worth
restoring (a restore replaces the whole hot context)."""


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """One cold entry: the tokens whose KV it holds, its size in host RAM, and when it was
    last used (a counter the engine advances per request, not a clock)."""

    key: int
    tokens: tuple[int, ...]
    size_bytes: int
    last_used: int


@dataclass(frozen=True, slots=True)
class PrefixChoice:
    """Where a request's KV starts from.

    `source` is "hot" (keep the context's own prefix), "cold" (restore entry `entry_key`
    first) or "none" (evaluate from scratch); `reused_tokens` is how many prompt tokens
    that start covers; `save_hot` says the hot sequence holds tokens the request will
    overwrite and that are worth keeping, so the engine saves it to the cold store first."""

    source: Literal["hot", "cold", "none"]
    reused_tokens: int
    save_hot: bool
    entry_key: int | None = None


@dataclass(frozen=True, slots=True)
class Admission:
    """The cold store after admitting an entry: `kept` (new entry included if it fit) and
    the keys `evicted` (whose bytes the engine frees)."""

    kept: tuple[CachedPrefix, ...]
    evicted: tuple[int, ...]
    admitted: bool


@dataclass(slots=True)
class PrefixStats:
    """Counters a test or the metrics endpoint reads: prompt tokens re-used from the hot
    context and from restored cold entries, saves, restores and evictions."""

    hot_hit_tokens: int = 0
    cold_hit_tokens: int = 0
    saves: int = 0
    restores: int = 0
    evictions: int = 0
    cold_bytes: int = 0
    cold_entries: int = 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def choose_prefix(
    prompt: Sequence[int],
    hot: Sequence[int],
    cold: Sequence[CachedPrefix],
    *,
    min_saved_tokens: int = MIN_SAVED_TOKENS,
    min_restore_gain: int = MIN_RESTORE_GAIN,
) -> PrefixChoice:
    """The start for `prompt` given the `hot` sequence and the `cold` entries.

    At most len(prompt) - 1 tokens are re-used: the last prompt token is always evaluated,
    so its logits (the first sampled token's) are live. Among cold entries the longest
    match wins, then the most recently used."""
    limit = max(0, len(prompt) - 1)
    hot_match = min(common_prefix(hot, prompt), limit)
    best: CachedPrefix | None = None
    best_match = 0
    for entry in cold:
        match = min(common_prefix(entry.tokens, prompt), limit)
        if match > best_match or (match == best_match and best is not None and entry.last_used > best.last_used):
            best, best_match = entry, match
    use_cold = best is not None and best_match >= hot_match + max(1, min_restore_gain)
    kept_hot = 0 if use_cold else hot_match
    save_hot = len(hot) - kept_hot >= min_saved_tokens and not _covered(hot, cold)
    if use_cold:
        assert best is not None
        return PrefixChoice("cold", best_match, save_hot, best.key)
    if hot_match > 0:
        return PrefixChoice("hot", hot_match, save_hot)
    return PrefixChoice("none", 0, save_hot)


def admit(entries: Sequence[CachedPrefix], new: CachedPrefix, budget_bytes: int) -> Admission:
    """The cold store with `new` admitted: entries whose tokens are a prefix of `new`'s are
    dropped (any prompt matches `new` at least as far), then the least recently used go
    until everything fits `budget_bytes`. An entry larger than the whole budget is not
    admitted and evicts nothing."""
    if new.size_bytes > budget_bytes:
        return Admission(tuple(entries), (), False)
    evicted: list[int] = []
    kept: list[CachedPrefix] = []
    for entry in entries:
        if len(entry.tokens) <= len(new.tokens) and new.tokens[: len(entry.tokens)] == entry.tokens:
            evicted.append(entry.key)
        else:
            kept.append(entry)
    total = sum(e.size_bytes for e in kept) + new.size_bytes
    for entry in sorted(kept, key=lambda e: e.last_used):
        if total <= budget_bytes:
            break
        kept.remove(entry)
        evicted.append(entry.key)
        total -= entry.size_bytes
    return Admission((*kept, new), tuple(evicted), True)


def touch(entries: Sequence[CachedPrefix], key: int, now: int) -> tuple[CachedPrefix, ...]:
    """The entries with `key` marked used at `now`."""
    return tuple(CachedPrefix(e.key, e.tokens, e.size_bytes, now) if e.key == key else e for e in entries)


def cold_budget_bytes(planned: int | None, env: Mapping[str, str]) -> int:
    """The cold store's budget: the node setting (`SKULK_KV_COLD_BUDGET_MB`) when set, else
    the capacity planner's `cold_budget_bytes` when it planned one, else the default.
    A malformed setting is refused rather than silently replaced."""
    raw = setting(COLD_BUDGET_ENV, env)
    if raw:
        try:
            mib = float(raw)
        except ValueError:
            raise ValueError(f"{COLD_BUDGET_ENV} must be a number of MiB >= 0, got {raw!r}") from None
        if mib < 0:
            raise ValueError(f"{COLD_BUDGET_ENV} must be a number of MiB >= 0, got {raw!r}")
        return int(mib * 1024 * 1024)
    if planned is not None and planned > 0:
        return planned
    return DEFAULT_COLD_BUDGET_BYTES


def _covered(hot: Sequence[int], cold: Sequence[CachedPrefix]) -> bool:
    """A cold entry already holds all of `hot` (it starts with it): saving adds nothing."""
    n = len(hot)
    return any(len(e.tokens) >= n and common_prefix(e.tokens, hot) == n for e in cold)


__all__ = [
    "COLD_BUDGET_ENV",
    "DEFAULT_COLD_BUDGET_BYTES",
    "MIN_RESTORE_GAIN",
    "MIN_SAVED_TOKENS",
    "Admission",
    "CachedPrefix",
    "PrefixChoice",
    "PrefixStats",
    "admit",
    "choose_prefix",
    "cold_budget_bytes",
    "common_prefix",
    "touch",
]
