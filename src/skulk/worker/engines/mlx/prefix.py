"""The MLX engine's prefix cache: the hot KV cache kept between requests, and earlier
conversations' caches kept in (unified) RAM within a cold budget.

mlx-lm's `KVCache` holds a layer's `keys` and `values` up to `offset` (what its `state`
reads and writes, whose shape varies across mlx-lm releases, so the three attributes are
used directly) and `trim(n)` drops the last n positions, as `trim_prompt_cache` does. Which cached
prefix a prompt starts from and what the cold store evicts is `prefix_cache` (pure); this
class only moves arrays.

Only a single-rank, unbatched engine uses it: in a group every rank would have to keep and
restore its own layers' caches in lockstep, and the batch loop owns its own caches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from skulk.shared.prefix_cache import CachedPrefix, PrefixStats, admit, choose_prefix, touch


class MlxPrefixStore:
    """The hot cache (and the tokens its KV holds) plus cold snapshots of earlier ones."""

    def __init__(self, make_cache: Callable[[], list[Any]], budget_bytes: int) -> None:
        self._make_cache = make_cache
        self.budget_bytes = budget_bytes
        self.stats = PrefixStats()
        self.hot: list[Any] = []
        self.hot_tokens: list[int] = []
        self._entries: tuple[CachedPrefix, ...] = ()
        self._states: dict[int, list[tuple[Any, Any]]] = {}
        self._clock = 0
        self._next_key = 0

    @property
    def entries(self) -> tuple[CachedPrefix, ...]:
        return self._entries

    def prepare(self, prompt: Sequence[int]) -> int:
        """Make `hot` the best cached start for `prompt` (saving the old hot cache first
        when it is about to be overwritten); how many prompt tokens it already holds."""
        self._clock += 1
        cold = self._entries if self.budget_bytes > 0 else ()
        held = self._held()
        choice = choose_prefix(prompt, self.hot_tokens[:held], cold)
        if choice.save_hot and self.budget_bytes > 0:
            self._save_hot(held)
        if choice.source == "cold" and choice.entry_key is not None:
            self._restore(choice.entry_key)
            self.stats.cold_hit_tokens += choice.reused_tokens
        elif choice.source == "hot":
            self.stats.hot_hit_tokens += choice.reused_tokens
        keep = choice.reused_tokens
        if keep == 0 or not self.hot:
            self.hot, self.hot_tokens = self._make_cache(), []
            return 0
        for layer in self.hot:
            excess = layer.offset - keep
            if excess > 0:
                layer.trim(excess)
        self.hot_tokens = self.hot_tokens[:keep]
        return keep

    def forget_hot(self) -> None:
        """The hot cache's contents are unknown (a step failed): start the next request afresh."""
        self.hot, self.hot_tokens = [], []

    def clear(self) -> None:
        self.forget_hot()
        self._entries = ()
        self._states.clear()

    def _held(self) -> int:
        """Tokens whose KV the hot cache really holds (a failed step may have left fewer)."""
        if not self.hot:
            return 0
        return min(len(self.hot_tokens), min(layer.offset for layer in self.hot))

    def _save_hot(self, held: int) -> None:
        import mlx.core as mx

        if held <= 0:
            return
        layers = []
        for layer in self.hot:
            layers.append((layer.keys[..., :held, :], layer.values[..., :held, :]))
        mx.eval(layers)
        size = sum(int(k.nbytes) + int(v.nbytes) for k, v in layers)
        key = self._next_key
        self._next_key += 1
        admission = admit(self._entries, CachedPrefix(key, tuple(self.hot_tokens[:held]), size, self._clock),
                          self.budget_bytes)
        if not admission.admitted:
            return
        self._states[key] = layers
        for gone in admission.evicted:
            self._states.pop(gone, None)
        self.stats.evictions += len(admission.evicted)
        self.stats.saves += 1
        self._entries = admission.kept
        self.stats.cold_entries = len(self._entries)
        self.stats.cold_bytes = sum(e.size_bytes for e in self._entries)

    def _restore(self, key: int) -> None:
        import mlx.core as mx

        entry = next(e for e in self._entries if e.key == key)
        cache = self._make_cache()
        for layer, (keys, values) in zip(cache, self._states[key], strict=True):
            # Fresh array objects: the cache writes new positions into its arrays in place,
            # and the cold entry must stay as it was saved.
            layer.keys, layer.values, layer.offset = mx.array(keys), mx.array(values), len(entry.tokens)
        self.hot, self.hot_tokens = cache, list(entry.tokens)
        self._entries = touch(self._entries, key, self._clock)
        self.stats.restores += 1


__all__ = ["MlxPrefixStore"]
