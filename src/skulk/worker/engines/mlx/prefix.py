"""The MLX engine's prefix cache: the hot KV cache kept between requests, and earlier
conversations' caches kept in (unified) RAM within a cold budget.

mlx-lm's `KVCache` holds a layer's `keys` and `values` up to `offset` (what its `state`
reads and writes, whose shape varies across mlx-lm releases, so the three attributes are
used directly) and `trim(n)` drops the last n positions, as `trim_prompt_cache` does. A
`QuantizedKVCache` (a q8_0/q4_0 placement, `mlx.kv_quant`) holds (packed, scales, biases)
triples in `keys` and `values`, sliced and copied alike. Which cached
prefix a prompt starts from and what the cold store evicts is `prefix_cache` (pure); this
class only moves arrays.

Only a single rank uses it: in a group every rank would have to keep and restore its own
layers' caches in lockstep. Unbatched, the engine decodes on `hot` (`prepare`, one request at
a time). Batched, there is no hot cache: each request borrows the best cold prefix (`lend`)
for mlx-lm's `BatchGenerator` to merge into its batch cache, and each sequence's KV comes back
when it leaves the batch (`keep`, what `BatchKVCache.extract` returns: one sequence, exactly
its tokens). Both run on the batch loop's thread, and need every layer to be a plain mlx-lm
`KVCache` (`reusable_in_batch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from skulk.shared.prefix_cache import (
    MIN_SAVED_TOKENS,
    CachedPrefix,
    PrefixStats,
    admit,
    choose_prefix,
    common_prefix,
    touch,
)
from skulk.worker.engines.mlx.kv_quant import cache_copy, cache_nbytes, cache_slice, quantized_cache_classes


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

    def lend(self, prompt: Sequence[int]) -> tuple[list[Any] | None, int]:
        """Batch mode: a cache holding the best cold prefix of `prompt` and how many prompt
        tokens it covers, or (None, 0). Its layers are the entry's own arrays with `offset`
        at the covered length: `BatchGenerator.insert` copies that much into its batch cache
        and never writes them (a cold entry must stay as it was saved)."""
        self._clock += 1
        if self.budget_bytes <= 0:
            return None, 0
        choice = choose_prefix(prompt, (), self._entries)
        if choice.source != "cold" or choice.entry_key is None:
            return None, 0
        cache = self._make_cache()
        for layer, (keys, values) in zip(cache, self._states[choice.entry_key], strict=True):
            layer.keys, layer.values, layer.offset = keys, values, choice.reused_tokens
        self._entries = touch(self._entries, choice.entry_key, self._clock)
        self.stats.restores += 1
        self.stats.cold_hit_tokens += choice.reused_tokens
        return cache, choice.reused_tokens

    def keep(self, tokens: Sequence[int], cache: list[Any]) -> None:
        """Batch mode: offer a sequence's KV (`cache` holds `tokens`) to the cold store. Short
        sequences, ones an entry already covers and ones over the whole budget are let go
        before any byte is copied."""
        import mlx.core as mx

        held = min(len(tokens), *(layer.offset for layer in cache)) if cache else 0
        if self.budget_bytes <= 0 or held < MIN_SAVED_TOKENS:
            return
        prefix = tuple(tokens[:held])
        if any(len(e.tokens) >= held and common_prefix(e.tokens, prefix) == held for e in self._entries):
            return
        layers = [(cache_slice(layer.keys, held), cache_slice(layer.values, held)) for layer in cache]
        if sum(cache_nbytes(k) + cache_nbytes(v) for k, v in layers) > self.budget_bytes:
            return  # still lazy: nothing was copied
        mx.eval(layers)
        self._admit(prefix, layers)

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
            layers.append((cache_slice(layer.keys, held), cache_slice(layer.values, held)))
        mx.eval(layers)
        self._admit(tuple(self.hot_tokens[:held]), layers)

    def _admit(self, tokens: tuple[int, ...], layers: list[tuple[Any, Any]]) -> None:
        size = sum(cache_nbytes(k) + cache_nbytes(v) for k, v in layers)
        key = self._next_key
        self._next_key += 1
        admission = admit(self._entries, CachedPrefix(key, tokens, size, self._clock), self.budget_bytes)
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
        entry = next(e for e in self._entries if e.key == key)
        cache = self._make_cache()
        for layer, (keys, values) in zip(cache, self._states[key], strict=True):
            # Fresh array objects: the cache writes new positions into its arrays in place,
            # and the cold entry must stay as it was saved.
            layer.keys, layer.values, layer.offset = cache_copy(keys), cache_copy(values), len(entry.tokens)
        self.hot, self.hot_tokens = cache, list(entry.tokens)
        self._entries = touch(self._entries, key, self._clock)
        self.stats.restores += 1


def reusable_in_batch(cache: list[Any]) -> bool:
    """Whether a batch can lend and keep prefixes of a model whose fresh cache is `cache`:
    every layer a plain `KVCache` (whose keys and values are exactly its tokens; a rotating
    window's are not)."""
    from mlx_lm.models.cache import KVCache

    quantized, _ = quantized_cache_classes()
    return bool(cache) and all(type(layer) in (KVCache, quantized) for layer in cache)


__all__ = ["MlxPrefixStore", "reusable_in_batch"]
