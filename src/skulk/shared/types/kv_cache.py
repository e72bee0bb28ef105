"""The KV cache's element type: engine-neutral names, their bytes, and who can serve them.

A quantized KV cache holds more context in the same memory: `q8_0` stores each K and V
element in 34 bytes per block of 32 (8-bit values and one f16 scale), `q4_0` in 18, where
`f16` takes 64. Operators name the type once (`kv_cache_backend` in skulk.yaml, a card's
`runtime.kv_cache_backend`, or a placement's `kvCacheType`) and each engine maps it to its
own switch: llama.cpp's `type_k`/`type_v` (in-process) and `--cache-type-k/-v` (llama-server).
The capacity arithmetic (`skulk.shared.memory_estimate`, `skulk.capacity.planner`) counts
the quantized size, so the admitted context grows by the same ratio.

llama.cpp quantizes the V cache only with flash attention, so a card that pins
`flash_attn = false` cannot take a quantized type; an engine whose traits list only `f16`
(MLX and vLLM here) refuses the others. Both are refused before anything loads, by name
(`kv_cache_type_refusal`). Pure; data and functions only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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
"""Bytes one cached K or V element takes, blocks' scales included."""

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
                     + (" (mlx_quantized was never served; q8_0 or q4_0 quantize the cache on llama.cpp)"
                        if value == "mlx_quantized" else ""))


def chosen_kv_cache_type(requested: str | None, card_default: str | None, node_default: str) -> KvCacheType:
    """The KV cache type a placement uses: the placement's own choice, else the model card's
    (`runtime.kv_cache_backend`), else the placing node's (`kv_cache_backend` in skulk.yaml)."""
    return parse_kv_cache_type(requested or card_default or node_default)


def kv_bytes_per_element_group(elements: int, kv_type: str) -> int:
    """Bytes of `elements` cached K/V values of `kv_type`, rounded up to a whole byte."""
    return math.ceil(elements * KV_ELEMENT_BYTES[kv_type])


def kv_cache_type_refusal(backend: str, kv_type: str, flash_attn: bool | None = None) -> str | None:
    """Why a shard on `backend` (a backend tag) cannot hold a `kv_type` cache, or None.
    `flash_attn`: the card's pin (None: the engine's default, on)."""
    engine = backend.partition("-")[0]
    if kv_type not in traits_of(engine).kv_cache_types:
        served = ", ".join(traits_of(engine).kv_cache_types) or "none"
        return f"the {engine} engine serves KV cache types {served}, not {kv_type}"
    if kv_type != DEFAULT_KV_CACHE_TYPE and flash_attn is False:
        return "llama.cpp quantizes the V cache only with flash attention, which this card pins off (runtime.flash_attn)"
    return None


__all__ = [
    "DEFAULT_KV_CACHE_TYPE",
    "KV_CACHE_TYPES",
    "KV_ELEMENT_BYTES",
    "LEGACY_KV_CACHE_BACKENDS",
    "KvCacheType",
    "chosen_kv_cache_type",
    "kv_bytes_per_element_group",
    "kv_cache_type_refusal",
    "parse_kv_cache_type",
]
