"""The MLX engine's quantized KV cache: the mlx-lm cache a placement's KV cache type builds.

A shard stamped `q8_0` or `q4_0` (`ShardAssignment.kv_cache_type`) caches every layer's keys
and values in mlx-lm's `QuantizedKVCache` (8 or 4 bits, `MLX_KV_BITS`) on every rank it runs:
one rank, a pipeline stage or a tensor rank (whose heads keep their full width). mlx-lm's
attention sees the cache's `bits` and runs its quantized attention. The cache is quantized
from its first token (mlx-lm's `quantized_kv_start` of 0, not its default of 5000), so all of
it is the size the planner counted (`skulk.shared.types.kv_cache`); the group size follows the
model's head widths (`mlx_kv_group_size`: 64, else 32).

mlx-lm's own batch cache holds plain arrays only (its server turns batching off when
`--kv-bits` is set), so this module gives its `BatchGenerator` a batch cache for the quantized
layout (`quantized_cache_classes`): a single rank batches on a quantized cache as on a plain
one. The prefix store keeps, lends and restores the cache's (packed, scales, biases) triples.

This module never decides placement (the planner refuses what no group divides); a load that
still meets such a model, or a cache layer mlx-lm cannot quantize, fails by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from skulk.shared.types.kv_cache import DEFAULT_KV_CACHE_TYPE, MLX_KV_BITS, mlx_kv_group_size
from skulk.worker.engines.base import ModelLoadFailed


@dataclass(frozen=True)
class KvQuantization:
    """How one rank quantizes its KV cache."""

    kv_type: str
    bits: int
    group_size: int


def kv_quantization(kv_type: str, head_dims: Sequence[int]) -> KvQuantization | None:
    """The quantization a `kv_type` shard of a model with `head_dims` (key and value head
    widths) runs, None for the plain cache; `ModelLoadFailed` naming why it cannot."""
    if kv_type == DEFAULT_KV_CACHE_TYPE:
        return None
    if kv_type not in MLX_KV_BITS:
        raise ModelLoadFailed(f"the MLX engine has no {kv_type!r} KV cache")
    group = mlx_kv_group_size(head_dims)
    if group is None:
        raise ModelLoadFailed(f"MLX cannot quantize this model's KV cache to {kv_type}: no group size divides its "
                              f"head widths {', '.join(map(str, head_dims))}")
    return KvQuantization(kv_type, MLX_KV_BITS[kv_type], group)


def quantized_cache(cache: list[Any], quantization: KvQuantization | None) -> list[Any]:
    """`cache` (a fresh prompt cache) with every layer a `QuantizedKVCache` of `quantization`
    (unchanged when None). Only plain `KVCache` layers convert: a rotating window or a state
    space layer fails the load by name rather than run unquantized while counted quantized."""
    if quantization is None:
        return cache
    from mlx_lm.models.cache import KVCache

    others = sorted({type(layer).__name__ for layer in cache if type(layer) is not KVCache})
    if others:
        raise ModelLoadFailed(f"this model's KV cache has {', '.join(others)} layers, which the MLX engine cannot "
                              f"quantize to {quantization.kv_type}: place it with an f16 KV cache")
    sequence_cache, _ = quantized_cache_classes()
    return [sequence_cache(group_size=quantization.group_size, bits=quantization.bits) for _ in cache]


def cache_slice(part: Any, held: int) -> Any:
    """The first `held` positions of one layer's keys or values: an array, or a quantized
    cache's (packed, scales, biases) triple."""
    if isinstance(part, tuple):
        return tuple(cache_slice(p, held) for p in part)  # pyright: ignore[reportUnknownVariableType]
    return part[..., :held, :]


def cache_copy(part: Any) -> Any:
    """A fresh copy of keys or values (array or triple): the cache writes new positions into
    its arrays in place, and a saved prefix must stay as it was."""
    import mlx.core as mx

    if isinstance(part, tuple):
        return tuple(cache_copy(p) for p in part)  # pyright: ignore[reportUnknownVariableType]
    return mx.array(part)


def cache_nbytes(part: Any) -> int:
    """Bytes of keys or values (array or triple)."""
    if isinstance(part, tuple):
        return sum(cache_nbytes(p) for p in part)  # pyright: ignore[reportUnknownVariableType]
    return int(part.nbytes)


def quantized_cache_classes() -> tuple[type, type]:
    """(one sequence's batchable quantized cache, the batch's), built on first use: mlx-lm is
    imported only where the engine runs. mlx-lm ships neither: its `BatchKVCache` holds plain
    arrays, and its `QuantizedKVCache` cannot merge into a batch. These hold each of keys and
    values as mlx's (packed, scales, biases) triple, every one of which shares the plain
    arrays' batch and sequence axes, so each batch operation is the plain one applied to the
    three arrays alike; attention sees `bits` and runs mlx-lm's quantized attention with the
    batch's padding mask."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, QuantizedKVCache, dynamic_roll

    def each(part: Any, fn: Any) -> Any:
        return None if part is None else tuple(fn(x) for x in part)

    class SequenceQuantizedKVCache(QuantizedKVCache):
        """mlx-lm's `QuantizedKVCache` that can join (`merge`) a batch."""

        def size(self) -> int:
            return self.offset

        @classmethod
        def merge(cls, caches: list[Any]) -> Any:
            return BatchQuantizedKVCache.merge(caches)

    class BatchQuantizedKVCache(BatchKVCache):
        def __init__(self, left_padding: list[int], group_size: int, bits: int) -> None:
            super().__init__(left_padding)
            self.group_size, self.bits = group_size, bits

        def update_and_fetch(self, keys: Any, values: Any) -> Any:
            prev, steps = self._idx, keys.shape[2]
            if self.keys is None or prev + steps > self.keys[0].shape[2]:
                batch, heads = keys.shape[0], keys.shape[1]
                size = (self.step + steps - 1) // self.step * self.step
                per_int = 32 // self.bits

                def fresh(dim: int) -> tuple[Any, Any, Any]:
                    return (mx.zeros((batch, heads, size, dim // per_int), dtype=mx.uint32),
                            mx.zeros((batch, heads, size, dim // self.group_size), dtype=keys.dtype),
                            mx.zeros((batch, heads, size, dim // self.group_size), dtype=keys.dtype))

                new_k, new_v = fresh(keys.shape[3]), fresh(values.shape[3])
                if self.keys is None:
                    self.keys, self.values = new_k, new_v
                else:
                    if prev % self.step:
                        self.keys = each(self.keys, lambda x: x[..., :prev, :])
                        self.values = each(self.values, lambda x: x[..., :prev, :])
                    self.keys = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.keys, new_k, strict=True))
                    self.values = tuple(mx.concatenate([a, b], axis=2) for a, b in zip(self.values, new_v, strict=True))
            self.offset = self.offset + steps
            self._idx += steps
            for stored, new in ((self.keys, keys), (self.values, values)):
                packed = mx.quantize(new, group_size=self.group_size, bits=self.bits)
                for part, value in zip(stored, packed, strict=True):
                    part[..., prev : self._idx, :] = value
            return self.keys_and_values()

        def keys_and_values(self) -> Any:
            idx = self._idx
            return each(self.keys, lambda x: x[..., :idx, :]), each(self.values, lambda x: x[..., :idx, :])

        def finalize(self) -> None:
            if self._right_padding is not None:
                padding = self._right_padding
                self.keys = each(self.keys, lambda x: dynamic_roll(x, padding[:, None], axis=2))
                self.values = each(self.values, lambda x: dynamic_roll(x, padding[:, None], axis=2))
                self.offset = self.offset - padding
                self.left_padding += padding
                self._right_padding = None

        def filter(self, batch_indices: Any) -> None:
            self.keys = each(self.keys, lambda x: x[batch_indices])
            self.values = each(self.values, lambda x: x[batch_indices])
            self.offset = self.offset[batch_indices]
            self.left_padding = self.left_padding[batch_indices]
            shift = min(cast("list[int]", self.left_padding.tolist()))
            if shift > 0:
                self.keys = each(self.keys, lambda x: x[..., shift:, :])
                self.values = each(self.values, lambda x: x[..., shift:, :])
                self._idx -= shift
                self.left_padding -= shift

        def extend(self, other: Any) -> None:
            if self.keys is None and other.keys is None:
                self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
                self.offset = mx.concatenate([self.offset, other.offset])
                return
            max_idx = max(self._idx, other._idx)
            template = self.keys if self.keys is not None else other.keys
            value_template = self.values if self.values is not None else other.values
            max_size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)

            def pad(c: Any) -> tuple[Any, Any, Any, Any]:
                k, v = c.keys, c.values
                if k is None:
                    rows = c.offset.shape[0]
                    k = tuple(mx.zeros((rows, x.shape[1], 0, x.shape[3]), dtype=x.dtype) for x in template)
                    v = tuple(mx.zeros((rows, x.shape[1], 0, x.shape[3]), dtype=x.dtype) for x in value_template)
                left = max_idx - c._idx
                right = max_size - k[0].shape[2] - left
                if right < 0:
                    k, v = each(k, lambda x: x[..., :right, :]), each(v, lambda x: x[..., :right, :])
                    right = 0
                if left or right:
                    widths = [(0, 0), (0, 0), (left, right), (0, 0)]
                    k, v = each(k, lambda x: mx.pad(x, widths)), each(v, lambda x: mx.pad(x, widths))
                return k, v, c.offset, c.left_padding + left

            (k1, v1, o1, p1), (k2, v2, o2, p2) = pad(self), pad(other)
            self.keys = tuple(mx.concatenate([a, b]) for a, b in zip(k1, k2, strict=True))
            self.values = tuple(mx.concatenate([a, b]) for a, b in zip(v1, v2, strict=True))
            self.offset, self.left_padding = mx.concatenate([o1, o2]), mx.concatenate([p1, p2])
            self._idx = max_idx

        def extract(self, idx: int) -> Any:
            cache = SequenceQuantizedKVCache(group_size=self.group_size, bits=self.bits)
            mx.eval(self.left_padding)
            padding = cast("list[int]", self.left_padding.tolist())[idx]
            end = self._idx
            cache.keys = each(self.keys, lambda x: mx.contiguous(x[idx : idx + 1, :, padding:end]))
            cache.values = each(self.values, lambda x: mx.contiguous(x[idx : idx + 1, :, padding:end]))
            cache.offset = end - padding
            return cache

        @classmethod
        def merge(cls, caches: list[Any]) -> Any:
            first = caches[0]
            lengths = [c.offset if c.keys is not None else 0 for c in caches]
            longest = max(lengths)
            padding = [longest - n for n in lengths]
            cache = cls(padding, first.group_size, first.bits)
            if longest == 0:
                return cache
            held = [c for c in caches if c.keys is not None]

            def stacked(parts: list[Any]) -> tuple[Any, ...]:
                out = []
                for i in range(3):
                    sample = parts[0][i]
                    out.append(mx.zeros((len(caches), sample.shape[1], longest, sample.shape[3]), dtype=sample.dtype))
                return tuple(out)

            keys, values = stacked([c.keys for c in held]), stacked([c.values for c in held])
            for row, (pad, c) in enumerate(zip(padding, caches, strict=True)):
                if c.keys is None:
                    continue
                for whole, part in ((keys, c.keys), (values, c.values)):
                    for i in range(3):
                        whole[i][row : row + 1, :, pad : pad + c.offset] = part[i][..., : c.offset, :]
            cache.keys, cache.values = keys, values
            cache.offset = cache.offset + longest
            cache._idx = longest
            return cache

        @property
        def nbytes(self) -> int:
            if self.keys is None:
                return 0
            return sum(int(x.nbytes) for x in (*self.keys, *self.values))

    _CLASSES = (SequenceQuantizedKVCache, BatchQuantizedKVCache)
    return _CLASSES


_CLASSES: tuple[type, type] | None = None


__all__ = ["KvQuantization", "cache_copy", "cache_nbytes", "cache_slice", "kv_quantization", "quantized_cache",
           "quantized_cache_classes"]
