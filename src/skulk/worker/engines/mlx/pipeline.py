"""One rank's stage of an MLX model: the layers it holds and one forward step through them.

A pipeline rank keeps only its contiguous layer range [start_layer, end_layer): the first
rank also keeps the embedding, the last the final norm and output head, and every other
weight is dropped before it is ever read from disk (mlx-lm loads lazily; arrays nobody
references are never materialised). A single-rank instance is a one-stage pipeline holding
everything, and a tensor rank is a one-stage "pipeline" whose layers were sharded by
`mlx_tensor`, so one forward function serves every mode.

`stage_role` and `check_layer_range` are pure. This module never communicates: the engine
moves activations between stages (so every send and receive sits under its watchdog).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skulk.shared.types.common import Sharding
from skulk.shared.types.instances import ShardAssignment
from skulk.worker.engines.base import ModelLoadFailed
from skulk.worker.engines.mlx.family import ModelParts
from skulk.worker.engines.mlx.kv_quant import KvQuantization, quantized_cache


@dataclass(frozen=True)
class StageRole:
    """What one rank does in each forward step."""

    rank: int
    world: int
    tensor: bool
    start_layer: int
    end_layer: int

    @property
    def embeds(self) -> bool:
        """Turns token ids into hidden states (rank 0 of a pipeline; every tensor rank)."""
        return self.tensor or self.rank == 0

    @property
    def computes_logits(self) -> bool:
        """Runs the final norm and head and samples (last pipeline rank; every tensor rank)."""
        return self.tensor or self.rank == self.world - 1

    @property
    def receives_activations(self) -> bool:
        return not self.tensor and self.rank > 0

    @property
    def sends_activations(self) -> bool:
        return not self.tensor and self.rank < self.world - 1

    @property
    def returns_token(self) -> bool:
        """The last pipeline rank sends the sampled token back to rank 0 (its ring neighbour)."""
        return not self.tensor and self.world > 1 and self.rank == self.world - 1

    @property
    def awaits_token(self) -> bool:
        return not self.tensor and self.world > 1 and self.rank == 0


def check_layer_range(shard: ShardAssignment, num_layers: int, sharding: Sharding) -> tuple[int, int]:
    """The [start, end) this rank must hold, validated against the model. A tensor rank
    holds a slice of every layer, so its range must be the whole model."""
    start, end = shard.start_layer, shard.end_layer
    if not 0 <= start < end <= num_layers:
        raise ModelLoadFailed(f"rank {shard.rank} layer range [{start}, {end}) is outside the model's {num_layers} layers")
    if (sharding == "Tensor" or shard.world_size == 1) and (start, end) != (0, num_layers):
        raise ModelLoadFailed(
            f"rank {shard.rank} of a {sharding} instance must hold all {num_layers} layers, got [{start}, {end})"
        )
    return start, end


def stage_role(shard: ShardAssignment, sharding: Sharding, num_layers: int) -> StageRole:
    start, end = check_layer_range(shard, num_layers, sharding)
    return StageRole(
        rank=shard.rank,
        world=shard.world_size,
        tensor=sharding == "Tensor" and shard.world_size > 1,
        start_layer=start,
        end_layer=end,
    )


@dataclass
class Stage:
    """The modules one rank runs. Parts the rank does not need are None."""

    role: StageRole
    embed: Any | None
    layers: list[Any]
    norm: Any | None
    head: Any | None
    whole: Any | None = None
    """A single-rank instance of a family `mlx_family` has no adapter for: the whole mlx-lm
    model, run as mlx-lm runs it (its own cache layout, sliding windows included)."""
    kv: KvQuantization | None = None
    """The placement's quantized KV cache (`mlx.kv_quant`), None for the plain one."""

    def parameters(self) -> list[Any]:
        """Every array this stage holds (to materialise them, or count their bytes)."""
        if self.whole is not None:
            return [self.whole.parameters()]
        modules = [m for m in (self.embed, self.norm, *self.layers) if m is not None]
        params = [m.parameters() for m in modules]
        head_owner: Any = getattr(self.head, "__self__", self.head)  # a bound as_linear: its module
        if self.head is not None and head_owner is not self.embed:
            params.append(head_owner.parameters())
        return params

    def make_cache(self) -> list[Any]:
        from mlx_lm.models.cache import KVCache, make_prompt_cache

        fresh = make_prompt_cache(self.whole) if self.whole is not None else [KVCache() for _ in self.layers]
        return quantized_cache(fresh, self.kv)


def build_stage(parts: ModelParts, role: StageRole) -> Stage:
    """Keep only what `role` needs. The caller drops its reference to the full model, so
    the other layers' (lazy) weights are never loaded."""
    for index, layer in enumerate(parts.layers[role.start_layer : role.end_layer], start=role.start_layer):
        if getattr(layer, "use_sliding", False):
            raise ModelLoadFailed(f"layer {index} uses sliding-window attention, which the MLX stage does not run yet")
    head_needs_embed = getattr(parts.head, "__self__", None) is parts.embed
    keep_embed = role.embeds or (role.computes_logits and head_needs_embed)
    return Stage(
        role=role,
        embed=parts.embed if keep_embed else None,
        layers=list(parts.layers[role.start_layer : role.end_layer]),
        norm=parts.norm if role.computes_logits else None,
        head=parts.head if role.computes_logits else None,
    )


def whole_model_stage(model: Any, role: StageRole) -> Stage:
    """A one-rank stage running `model` whole: how a family without a layer adapter is served
    (every family mlx-lm loads runs on one rank; only adapted families span ranks)."""
    if role.world != 1:
        raise ModelLoadFailed("a model without an MLX layer adapter runs on one rank only")
    return Stage(role=role, embed=None, layers=[], norm=None, head=None, whole=model)


def whole_model_logits(stage: Stage, tokens: Any, cache: list[Any]) -> Any:
    """Logits of the last position (vocab,) from the whole model over `tokens`, updating `cache`."""
    assert stage.whole is not None
    return stage.whole(tokens[None], cache=cache)[0, -1]


def forward_layers(stage: Stage, hidden: Any, cache: list[Any]) -> Any:
    """Run this stage's layers over `hidden` (batch, tokens, hidden_size), updating `cache`."""
    from mlx_lm.models.base import create_attention_mask

    mask = create_attention_mask(hidden, cache[0] if cache else None)
    for layer, layer_cache in zip(stage.layers, cache, strict=True):
        hidden = layer(hidden, mask, cache=layer_cache)
    return hidden


def embed_tokens(stage: Stage, tokens: Any) -> Any:
    assert stage.embed is not None
    return stage.embed(tokens[None])


def last_logits(stage: Stage, hidden: Any) -> Any:
    """Logits of the last position only (vocab,): prefill never pays the head for the rest."""
    assert stage.norm is not None and stage.head is not None
    return stage.head(stage.norm(hidden[:, -1:, :]))[0, -1]


__all__ = [
    "Stage",
    "StageRole",
    "build_stage",
    "check_layer_range",
    "embed_tokens",
    "forward_layers",
    "last_logits",
    "stage_role",
    "whole_model_logits",
    "whole_model_stage",
]
