"""Tiny random Hugging-Face-style model folders for mlx-lm architectures beyond the built-in seven.

The project's own generator (`skulk.models.tiny_models`) writes one architecture, Llama. Tests
that serve other `model_type`s through the real MLX engine (a mixture of experts, models with
extra norms or scaled residuals, LayerNorm-and-bias models) need a checkpoint of that type that
loads offline in a second; this module writes one: a 2-layer, 64-wide network with random
weights, in the safetensors naming mlx-lm's `load` expects (Hugging Face's, passed through the
model class's `sanitize`), with the tiny Llama's tokenizer files, chat template and stop tokens,
so prompts, templates and stop handling behave exactly as with local/tiny-llama.

Weights come from the installed mlx-lm's own model class (its parameter names and shapes), filled
with the tiny generator's deterministic PCG64 noise keyed by (seed, tensor name): the same type
and seed give the same bytes on every run. As in the tiny Llama, the special tokens' lm_head rows
are zero, so a random model never ends a turn early and always runs to max_tokens.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from skulk.models import tiny_models
from skulk.models.tiny_models import SPECIAL_TOKENS, TINY_SPEC

HIDDEN_SIZE = 64
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = HIDDEN_SIZE // NUM_HEADS  # 16: types that derive head_dim from hidden/heads agree
INTERMEDIATE_SIZE = 128
NUM_EXPERTS = 4
EXPERTS_PER_TOKEN = 2
MOE_INTERMEDIATE_SIZE = 64
CONTEXT_LENGTH = 2048

SPEC = replace(
    TINY_SPEC,
    num_layers=NUM_LAYERS,
    hidden_size=HIDDEN_SIZE,
    intermediate_size=INTERMEDIATE_SIZE,
    num_attention_heads=NUM_HEADS,
    num_key_value_heads=NUM_KV_HEADS,
    head_dim=HEAD_DIM,
    context_length=CONTEXT_LENGTH,
)
"""The tiny Llama spec at this module's shapes: same vocabulary (tokenizer), dtype and rope."""


def _common_config() -> dict[str, Any]:
    return {
        "hidden_size": HIDDEN_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "vocab_size": SPEC.vocab_size,
        "max_position_embeddings": CONTEXT_LENGTH,
        "rope_theta": SPEC.rope_theta,
        "tie_word_embeddings": False,
        "torch_dtype": SPEC.dtype,
    }


def _qwen3_moe() -> dict[str, Any]:
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "head_dim": HEAD_DIM,
        "rms_norm_eps": SPEC.rms_norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "num_experts": NUM_EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "moe_intermediate_size": MOE_INTERMEDIATE_SIZE,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "rope_scaling": None,
    }


def _olmo2() -> dict[str, Any]:
    return {
        "architectures": ["Olmo2ForCausalLM"],
        "head_dim": HEAD_DIM,
        "rms_norm_eps": SPEC.rms_norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "rope_scaling": None,
    }


def _granite() -> dict[str, Any]:
    return {
        "architectures": ["GraniteForCausalLM"],
        "rms_norm_eps": SPEC.rms_norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rope_scaling": None,
        # Neutral multipliers: the usual 1/sqrt(head_dim) attention scale, unscaled logits.
        "attention_multiplier": HEAD_DIM**-0.5,
        "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "logits_scaling": 1.0,
    }


def _starcoder2() -> dict[str, Any]:
    return {
        "architectures": ["Starcoder2ForCausalLM"],
        "norm_epsilon": 1e-5,
        "hidden_act": "gelu_pytorch_tanh",
        "use_bias": True,
    }


_CONFIGS = {
    "qwen3_moe": _qwen3_moe,
    "olmo2": _olmo2,
    "granite": _granite,
    "starcoder2": _starcoder2,
}

TINY_MLX_TYPES: tuple[str, ...] = tuple(_CONFIGS)
"""model_types this module writes, each verified to load and decode greedily with the installed
mlx-lm (tests/models/test_tiny_mlx_archs.py)."""

MLX_MOE_TYPE: str | None = "qwen3_moe"
"""The mixture-of-experts type among TINY_MLX_TYPES (4 experts, 2 per token)."""

_RESIDUAL_OUTPUTS = ("o_proj", "down_proj", "c_proj")
"""Linear layers that write into the residual stream: RESIDUAL_GAIN, as in the tiny Llama."""
_EXPERTS = re.compile(r"^(?P<prefix>.*\.mlp)\.switch_mlp\.(?P<proj>\w+)\.weight$")


def config_for(model_type: str) -> dict[str, Any]:
    """config.json's model fields for `model_type` (token ids are added by the writer)."""
    if model_type not in _CONFIGS:
        raise ValueError(f"no tiny config for model_type {model_type!r}; known: {', '.join(TINY_MLX_TYPES)}")
    return {"model_type": model_type, **_common_config(), **_CONFIGS[model_type]()}


@functools.cache
def _tokenizer():
    return tiny_models.train_tokenizer(SPEC)


def _hf_shapes(model_type: str, config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor names and shapes: mlx-lm's model parameters, with stacked expert
    weights (switch_mlp) split back into HF's per-expert tensors, which `sanitize` restacks."""
    from mlx.utils import tree_flatten

    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    model = module.Model(module.ModelArgs.from_dict(dict(config)))
    shapes: dict[str, tuple[int, ...]] = {}
    parameters = cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
    for name, array in parameters:
        shape = tuple(array.shape)
        experts = _EXPERTS.match(name)
        if experts:
            for e in range(shape[0]):
                shapes[f"{experts['prefix']}.experts.{e}.{experts['proj']}.weight"] = shape[1:]
        else:
            shapes[name] = shape
    return dict(sorted(shapes.items()))


def _weights(shapes: Mapping[str, tuple[int, ...]], seed: int, silent_token_ids: list[int]) -> dict[str, np.ndarray]:
    weights: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            # Norm scales are ones; biases (LayerNorm's and linear layers') are zeros.
            fill = 0.0 if name.endswith(".bias") else 1.0
            weights[name] = np.full(shape, fill, dtype=np.float32)
        elif name.endswith("embed_tokens.weight"):
            weights[name] = tiny_models._uniform(seed, name, shape, tiny_models.EMBED_STD)
        else:
            if name == "lm_head.weight":
                gain = tiny_models.LOGIT_STD
            elif any(f".{out}." in name for out in _RESIDUAL_OUTPUTS):
                gain = tiny_models.RESIDUAL_GAIN
            else:
                gain = tiny_models.HIDDEN_GAIN
            weights[name] = tiny_models._uniform(seed, name, shape, gain / math.sqrt(shape[-1]))
    weights["lm_head.weight"][silent_token_ids] = 0.0
    return weights


def write_tiny_mlx_model(out_dir: Path, model_type: str, seed: int = 0) -> Path:
    """Write a tiny random `model_type` checkpoint into `out_dir` (created; must not exist)
    and return it. Deterministic for a given (model_type, seed)."""
    out_dir = Path(out_dir)
    config = config_for(model_type)
    tokenizer = _tokenizer()
    silent = [tokenizer.get_vocab()[token] for token in SPECIAL_TOKENS]
    weights = _weights(_hf_shapes(model_type, config), seed, silent)
    # The tiny Llama's writer: tokenizer files, chat template, generation config, safetensors.
    tiny_models._write_hf(out_dir, replace(SPEC, seed=seed), tokenizer, weights)
    # Its config.json is Llama's: keep the token ids, replace the architecture.
    written = json.loads((out_dir / "config.json").read_text(encoding="utf-8"))
    token_ids = {key: written[key] for key in ("bos_token_id", "eos_token_id")}
    tiny_models._write_json(out_dir / "config.json", {**config, **token_ids})
    return out_dir
