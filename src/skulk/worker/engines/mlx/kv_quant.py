"""The MLX engine's quantized KV cache: the mlx-lm cache a placement's KV cache type builds.

A shard stamped `q8_0` or `q4_0` (`ShardAssignment.kv_cache_type`) caches every layer's keys
and values in mlx-lm's `QuantizedKVCache` (8 or 4 bits, `MLX_KV_BITS`) on every rank it runs:
one rank, a pipeline stage or a tensor rank (whose heads keep their full width). mlx-lm's
attention sees the cache's `bits` and runs its quantized attention. The cache is quantized
from its first token (mlx-lm's `quantized_kv_start` of 0, not its default of 5000), so all of
it is the size the planner counted (`skulk.shared.types.kv_cache`); the group size follows the
model's head widths (`mlx_kv_group_size`: 64, else 32).

mlx-lm's `BatchGenerator` cannot merge a quantized cache (its own server turns batching off
when `--kv-bits` is set), so a single rank with one serves one request at a time; its prefix
store keeps and restores the cache's (packed values, scales, biases) triples.

This module never decides placement (the planner refuses what no group divides); a load that
still meets such a model, or a cache layer mlx-lm cannot quantize, fails by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    others = sorted({type(layer).__name__ for layer in cache if type(layer) is not KVCache})
    if others:
        raise ModelLoadFailed(f"this model's KV cache has {', '.join(others)} layers, which the MLX engine cannot "
                              f"quantize to {quantization.kv_type}: place it with an f16 KV cache")
    return [QuantizedKVCache(group_size=quantization.group_size, bits=quantization.bits) for _ in cache]


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


__all__ = ["KvQuantization", "cache_copy", "cache_nbytes", "cache_slice", "kv_quantization", "quantized_cache"]
