"""The KV cache's element type: engine-neutral names, their bytes, and who can serve them.

A quantized KV cache holds more context in the same memory: `q8_0` stores each K and V
element in 34 bytes per block of 32 (8-bit values and one f16 scale), `q4_0` in 18, where
`f16` takes 64. Operators name the type once (`kv_cache_backend` in skulk.yaml, a card's
`runtime.kv_cache_backend`, or a placement's `kvCacheType`) and each engine maps it to its
own switch: llama.cpp's `type_k`/`type_v` (in-process) and `--cache-type-k/-v` (llama-server),
mlx-lm's `QuantizedKVCache` (`bits` 8 or 4, `MLX_KV_BITS`) on MLX. The capacity arithmetic
(`skulk.shared.memory_estimate`, `skulk.capacity.planner`) counts the quantized size, so the
admitted context grows by the same ratio.

MLX quantizes each head's K and V vectors in groups along the head dimension (`mx.quantize`):
per group of g elements it stores the packed values and one scale and one bias in the
activation dtype (f16/bf16: 2 bytes each). With g = 64 that is 8/8 + 4/64 = 34/32 bytes an
element for 8 bits and 4/8 + 4/64 = 18/32 for 4 bits: exactly ggml's block sizes. A head
dimension that 64 does not divide is grouped by 32 (`mlx_kv_group_size`), which costs 4/32
per element instead: 36/32 and 20/32. The planner counts the larger of the two engines'
layouts for the card's head dimensions (`kv_element_bytes`), so it never under-counts
whichever engine serves the placement; for the usual head dims (64, 128, 256) the two agree.

llama.cpp quantizes the V cache only with flash attention, so a card that pins
`flash_attn = false` cannot take a quantized type; MLX cannot quantize a head dimension that
neither 64 nor 32 divides; an engine whose traits list only `f16` (vLLM here) refuses the
others. All are refused before anything loads, by name (`kv_cache_type_refusal`). Pure; data
and functions only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from types import MappingProxyType
from typing import Literal, get_args

from skulk.shared.types.engines import traits_of

KvCacheType = Literal["f16", "q8_0", "q4_0"]
KV_CACHE_TYPES: tuple[KvCacheType, ...] = get_args(KvCacheType)
DEFAULT_KV_CACHE_TYPE: KvCacheType = "f16"

KV_ELEMENT_BYTES: Mapping[str, Fraction] = MappingProxyType({
    "f16": Fraction(2),
    "q8_0": Fraction(34, 32),  # ggml block_q8_0: 32 int8 values and one f16 scale
    "q4_0": Fraction(18, 32),  # ggml block_q4_0: 32 4-bit values and one f16 scale
})
"""Bytes one cached K or V element takes in ggml's blocks, scales included."""

MLX_KV_BITS: Mapping[str, int] = MappingProxyType({"q8_0": 8, "q4_0": 4})
"""mlx-lm's `QuantizedKVCache(bits=...)` for each quantized type (f16 is its plain `KVCache`)."""

MLX_KV_GROUP_SIZES: tuple[int, ...] = (64, 32)
"""Group sizes tried in order: mlx-lm's default 64 (ggml's byte cost), else 32, the smallest
`mx.quantize` groups a head dimension by (the generated tiny models have 32-wide heads)."""

MLX_KV_SCALE_BYTES = 2
"""Bytes of one group's scale and of its bias: the activation dtype, f16 or bf16 on a served
model (a float32 model, such as the generated tiny ones, stores 4; the planner counts f16's 2
for the plain cache likewise)."""

LEGACY_KV_CACHE_BACKENDS: Mapping[str, KvCacheType | None] = MappingProxyType({
    "default": "f16",
    "mlx_quantized": None,
})
"""Names older configs and cards used: `default` still means f16; `mlx_quantized` named an
MLX cache that nothing ever loaded, and is refused with the names to use instead."""


def parse_kv_cache_type(value: str) -> KvCacheType:
    """`value` as a KV cache type, or ValueError naming the accepted values."""
    if value in KV_CACHE_TYPES:
        return value  # pyright: ignore[reportReturnType] -- checked just above
    if value in LEGACY_KV_CACHE_BACKENDS:
        mapped = LEGACY_KV_CACHE_BACKENDS[value]
        if mapped is not None:
            return mapped
    raise ValueError(f"{value!r} is not a KV cache type; use one of {', '.join(KV_CACHE_TYPES)}"
                     + (" (mlx_quantized was never served; q8_0 or q4_0 quantize the cache on llama.cpp and MLX)"
                        if value == "mlx_quantized" else ""))


def chosen_kv_cache_type(requested: str | None, card_default: str | None, node_default: str) -> KvCacheType:
    """The KV cache type a placement uses: the placement's own choice, else the model card's
    (`runtime.kv_cache_backend`), else the placing node's (`kv_cache_backend` in skulk.yaml)."""
    return parse_kv_cache_type(requested or card_default or node_default)


def mlx_kv_group_size(head_dims: Sequence[int]) -> int | None:
    """The group size MLX quantizes K/V heads of `head_dims` (key and value widths; 0, a
    keys-only cache's value width, is skipped) by, or None when no group size divides them."""
    widths = [d for d in head_dims if d > 0]
    return next((g for g in MLX_KV_GROUP_SIZES if all(d % g == 0 for d in widths)), None)


def mlx_kv_element_bytes(kv_type: str, group_size: int, scale_bytes: int = MLX_KV_SCALE_BYTES) -> Fraction:
    """Bytes one K or V element takes in mlx-lm's `QuantizedKVCache` of `kv_type`: the packed
    value (bits/8) plus its share of the group's scale and bias."""
    if kv_type not in MLX_KV_BITS:
        return Fraction(scale_bytes)  # the plain cache holds the activation dtype
    return Fraction(MLX_KV_BITS[kv_type], 8) + Fraction(2 * scale_bytes, group_size)


def kv_element_bytes(kv_type: str, head_dims: Sequence[int] = ()) -> Fraction:
    """Bytes one cached K or V element of `kv_type` takes for heads of `head_dims`: the larger
    of ggml's block layout and MLX's group layout (see the module doc), so the count holds
    for whichever engine serves the placement."""
    ggml = KV_ELEMENT_BYTES[kv_type]
    group = mlx_kv_group_size(head_dims) if head_dims else MLX_KV_GROUP_SIZES[0]
    return ggml if group is None else max(ggml, mlx_kv_element_bytes(kv_type, group))


def kv_bytes_per_element_group(elements: int, kv_type: str, head_dims: Sequence[int] = ()) -> int:
    """Bytes of `elements` cached K/V values of `kv_type` (heads of `head_dims`), rounded up
    to a whole byte."""
    return math.ceil(elements * kv_element_bytes(kv_type, head_dims))


def kv_cache_type_refusal(backend: str, kv_type: str, flash_attn: bool | None = None,
                          head_dims: Sequence[int] = ()) -> str | None:
    """Why a shard on `backend` (a backend tag) cannot hold a `kv_type` cache, or None.
    `flash_attn`: the card's pin (None: the engine's default, on). `head_dims`: the model's
    key and value head widths (MLX groups them)."""
    engine = backend.partition("-")[0]
    if kv_type not in traits_of(engine).kv_cache_types:
        served = ", ".join(traits_of(engine).kv_cache_types) or "none"
        return f"the {engine} engine serves KV cache types {served}, not {kv_type}"
    if kv_type == DEFAULT_KV_CACHE_TYPE:
        return None
    if engine == "mlx" and head_dims and mlx_kv_group_size(head_dims) is None:
        groups = " or ".join(map(str, MLX_KV_GROUP_SIZES))
        return (f"MLX quantizes the KV cache in groups of {groups} elements per head, which divide none of "
                f"this model's head widths {', '.join(map(str, head_dims))}")
    if engine != "mlx" and flash_attn is False:
        return "llama.cpp quantizes the V cache only with flash attention, which this card pins off (runtime.flash_attn)"
    return None


__all__ = [
    "DEFAULT_KV_CACHE_TYPE",
    "KV_CACHE_TYPES",
    "KV_ELEMENT_BYTES",
    "LEGACY_KV_CACHE_BACKENDS",
    "MLX_KV_BITS",
    "MLX_KV_GROUP_SIZES",
    "MLX_KV_SCALE_BYTES",
    "KvCacheType",
    "chosen_kv_cache_type",
    "kv_bytes_per_element_group",
    "kv_cache_type_refusal",
    "kv_element_bytes",
    "mlx_kv_element_bytes",
    "mlx_kv_group_size",
    "parse_kv_cache_type",
]
