"""Per-family knowledge the MLX engine needs about an mlx-lm model class, in one table.

The engine never asks "is this a Llama?": it looks the config's `model_type` up in
`FAMILIES` and gets a `FamilyAdapter` that says where the embedding, the decoder layers, the
final norm and the output head live, and which projections tensor parallelism shards. A
family missing from the table is refused at load with the list of supported ones, rather than
failing half-way through a forward pass.

This module never loads weights or talks to other ranks; it only names parts of a model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from skulk.worker.engines.base import ModelLoadFailed


@dataclass(frozen=True)
class ModelParts:
    """The pieces of a decoder-only model a stage runs, in order.

    `head` maps final hidden states to logits: the lm_head, or the embedding used as a linear
    layer when the family ties them."""

    embed: Any
    layers: list[Any]
    norm: Any
    head: Callable[[Any], Any]


@dataclass(frozen=True)
class TensorPlan:
    """Tensor-parallel sharding of one decoder layer: projections split by output columns
    (their outputs are per-head or per-neuron slices), projections split by input rows (their
    partial outputs are all_summed), and the head counts each rank keeps a 1/world share of."""

    attention: str
    column_sharded: tuple[str, ...]
    row_sharded: tuple[str, ...]
    head_count_attrs: tuple[str, ...]


@dataclass(frozen=True)
class FamilyAdapter:
    parts: Callable[[Any], ModelParts]
    tensor: TensorPlan | None


def _decoder_parts(model: Any) -> ModelParts:
    """mlx-lm's Llama-style layout: model.model.{embed_tokens,layers,norm} and either
    model.lm_head or tied embeddings."""
    inner = model.model
    tied = bool(getattr(model.args, "tie_word_embeddings", False)) or not hasattr(model, "lm_head")
    head = inner.embed_tokens.as_linear if tied else model.lm_head
    return ModelParts(embed=inner.embed_tokens, layers=list(inner.layers), norm=inner.norm, head=head)


_LLAMA_STYLE_TENSOR = TensorPlan(
    attention="self_attn",
    column_sharded=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"),
    row_sharded=("self_attn.o_proj", "mlp.down_proj"),
    head_count_attrs=("n_heads", "n_kv_heads"),
)

_LLAMA_STYLE = FamilyAdapter(parts=_decoder_parts, tensor=_LLAMA_STYLE_TENSOR)

FAMILIES: Mapping[str, FamilyAdapter] = MappingProxyType(
    {
        "llama": _LLAMA_STYLE,
        "mistral": _LLAMA_STYLE,
        "qwen2": _LLAMA_STYLE,
        "qwen3": _LLAMA_STYLE,
    }
)
"""Adapters keyed by the HF config's `model_type`. Qwen3's per-head q/k norms act on
head_dim, so splitting heads leaves them whole; Qwen2's q/k/v biases are column-sharded with
their weights by mlx's shard_linear."""


def adapter_for(model_type: str) -> FamilyAdapter | None:
    """The family's adapter, or None: a single rank then runs the whole mlx-lm model."""
    return FAMILIES.get(model_type)


def family_of(model_type: str) -> FamilyAdapter:
    adapter = FAMILIES.get(model_type)
    if adapter is None:
        raise ModelLoadFailed(f"the MLX engine has no adapter for model_type {model_type!r} (known: {sorted(FAMILIES)})")
    return adapter


__all__ = ["FAMILIES", "FamilyAdapter", "ModelParts", "TensorPlan", "adapter_for", "family_of"]
