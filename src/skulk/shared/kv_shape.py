"""What one token leaves in the KV cache, read the way the engines read a model's metadata.

Both the card builder and the capacity planner size the KV cache from a model's own
metadata; these rules keep them agreeing with each other and with the engines:

- the key's per-head dimension is `head_dim` when stated; a multi-head latent attention
  model (DeepSeek, Kimi, GLM-4 MoE Lite) states none, and its keys are
  `qk_nope_head_dim + qk_rope_head_dim` wide (hidden_size / heads would be far too small);
- a GGUF converted with MLA metadata (`attention.key_length_mla`) is cached by llama.cpp
  as one compressed latent per token in the keys alone (`llama-kv-cache.cpp` allocates no
  V tensor when `hparams.is_mla()`): its value dimension is 0;
- an MLX model whose mlx-lm class caches the latent (`MLX_LATENT_KV_TYPES`, generated from
  mlx-lm's code) holds one head of `kv_lora_rank` keys and `qk_rope_head_dim` values per
  token; every other config is costed as per-head keys and values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from skulk.shared.types.engine_architectures import MLX_LATENT_KV_TYPES, MLX_MODEL_REMAPPING

KEYS_ONLY = 0
"""A value dimension of 0: the engine caches keys only (llama.cpp's MLA latent)."""


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def config_key_head_dim(config: Mapping[str, Any], heads: int, hidden_size: int) -> int:
    """The key's per-head dimension from a (text) config.json: `head_dim`, else an MLA
    model's nope + rope split, else hidden_size / heads."""
    stated = _positive_int(config.get("head_dim"))
    if stated:
        return stated
    nope, rope = _positive_int(config.get("qk_nope_head_dim")), _positive_int(config.get("qk_rope_head_dim"))
    return nope + rope if nope and rope else hidden_size // heads


@dataclass(frozen=True)
class ConfigKvShape:
    """What a config.json model caches per token and layer: heads x (keys + values)."""

    kv_heads: int
    head_dim: int
    value_head_dim: int | None
    """None: the key's."""


def config_kv_shape(config: Mapping[str, Any], heads: int, hidden_size: int) -> ConfigKvShape:
    """The KV shape of a (text) config.json as mlx-lm caches it: the MLA latent for the types
    whose class caches it, per-head keys (see config_key_head_dim) and values otherwise."""
    model_type = config.get("model_type")
    rank, rope = _positive_int(config.get("kv_lora_rank")), _positive_int(config.get("qk_rope_head_dim"))
    if (isinstance(model_type, str) and MLX_MODEL_REMAPPING.get(model_type, model_type) in MLX_LATENT_KV_TYPES
            and rank and rope):
        return ConfigKvShape(kv_heads=1, head_dim=rank, value_head_dim=rope)
    return ConfigKvShape(kv_heads=_positive_int(config.get("num_key_value_heads")) or heads,
                         head_dim=config_key_head_dim(config, heads, hidden_size),
                         value_head_dim=_positive_int(config.get("v_head_dim")))


def gguf_value_head_dim(prefixed: Mapping[str, Any], key_length: int) -> int | None:
    """The value dimension to cost from a GGUF's metadata (keys without the architecture
    prefix): KEYS_ONLY for an MLA conversion, `attention.value_length` where it differs
    from the key's, None (the key's) otherwise."""
    if isinstance(prefixed.get("attention.key_length_mla"), int):
        return KEYS_ONLY
    value_length = prefixed.get("attention.value_length")
    if isinstance(value_length, int) and value_length != key_length:
        return value_length
    return None


def value_dim(head_dim: int, value_head_dim: int | None) -> int:
    """The cached value width per KV head: the key's when None, 0 when keys only."""
    return head_dim if value_head_dim is None else value_head_dim


__all__ = ["KEYS_ONLY", "ConfigKvShape", "config_key_head_dim", "config_kv_shape", "gguf_value_head_dim", "value_dim"]
