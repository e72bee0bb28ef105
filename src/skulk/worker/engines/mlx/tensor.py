"""Tensor parallelism for an MLX model: every rank holds 1/world of every layer.

Within each decoder layer the family's `TensorPlan` names the projections to split:
column-sharded ones (q/k/v, MLP gate/up) keep a contiguous block of output features, so each
rank computes whole attention heads and whole MLP neurons on its own; row-sharded ones (o,
MLP down) keep the matching block of input features and all_sum their partial outputs. That
is two all_sums per layer and no other communication; embedding, norms and head stay whole,
so every rank ends a step with the same logits.

Splitting is done with mlx.nn's `shard_linear`, applied to lazily loaded weights, so a rank
materialises only its slice. `tensor_split_error` (pure) explains a world size the model's
heads cannot be split into; placement applies the same rule before choosing it.
"""

from __future__ import annotations

from typing import Any

from skulk.worker.engines.base import ModelLoadFailed
from skulk.worker.engines.mlx.family import TensorPlan


def tensor_split_error(world: int, num_heads: int, num_kv_heads: int, intermediate_size: int) -> str | None:
    """Why `world` ranks cannot split this model evenly, or None when they can."""
    for name, count in (("attention heads", num_heads), ("KV heads", num_kv_heads), ("MLP width", intermediate_size)):
        if count % world:
            return f"{count} {name} do not divide into {world} ranks"
    return None


def _resolve(root: Any, dotted: str) -> tuple[Any, str]:
    *path, leaf = dotted.split(".")
    parent = root
    for name in path:
        parent = getattr(parent, name)
    return parent, leaf


def shard_layers(layers: list[Any], plan: TensorPlan, group: Any, config: dict[str, Any]) -> None:
    """Replace each layer's projections with this rank's shard (in place)."""
    from mlx.nn.layers.distributed import shard_linear

    world = group.size()
    reason = tensor_split_error(
        world,
        int(config["num_attention_heads"]),
        int(config.get("num_key_value_heads") or config["num_attention_heads"]),
        int(config["intermediate_size"]),
    )
    if reason is not None:
        raise ModelLoadFailed(f"tensor parallelism over {world} ranks is impossible: {reason}")
    for layer in layers:
        for dotted in plan.column_sharded:
            parent, leaf = _resolve(layer, dotted)
            setattr(parent, leaf, shard_linear(getattr(parent, leaf), "all-to-sharded", group=group))
        for dotted in plan.row_sharded:
            parent, leaf = _resolve(layer, dotted)
            setattr(parent, leaf, shard_linear(getattr(parent, leaf), "sharded-to-all", group=group))
        attention = getattr(layer, plan.attention)
        for attr in plan.head_count_attrs:
            setattr(attention, attr, getattr(attention, attr) // world)


__all__ = ["shard_layers", "tensor_split_error"]
