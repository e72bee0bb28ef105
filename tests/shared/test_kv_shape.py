"""The KV shape rules the card builder and the capacity planner share: an MLA model's key
width from its nope + rope split, llama.cpp's keys-only latent cache for a GGUF with MLA
metadata, mlx-lm's latent cache for the types whose class keeps it; the card and the
planner cost the same bytes from the same model."""

from __future__ import annotations

from pathlib import Path

import pytest

from skulk.capacity.planner import kv_bytes_per_token_per_layer as planner_kv_bytes
from skulk.capacity.planner import model_meta_from_config, model_meta_from_gguf
from skulk.models.card_builder import card_from_config, card_from_gguf
from skulk.shared.kv_shape import KEYS_ONLY, config_key_head_dim, gguf_value_head_dim, value_dim
from skulk.shared.memory_estimate import kv_bytes_per_token_per_layer as card_kv_bytes
from skulk.shared.types.engine_architectures import MLX_LATENT_KV_TYPES, MLX_MODEL_TYPES

DEEPSEEK_V3_ATTENTION = {"num_attention_heads": 128, "hidden_size": 7168, "qk_nope_head_dim": 128,
                         "qk_rope_head_dim": 64, "v_head_dim": 128, "kv_lora_rank": 512}
# llama.cpp's converter writes an MLA model as one KV head of the latent (512) + rope (64).
DEEPSEEK2_MLA_GGUF = {"attention.head_count": 128, "attention.head_count_kv": 1, "attention.key_length": 576,
                      "attention.value_length": 512, "attention.key_length_mla": 192,
                      "attention.value_length_mla": 128}


@pytest.mark.parametrize(("config", "expected"), [
    ({"head_dim": 256, "hidden_size": 2048, "num_attention_heads": 8}, 256),   # stated (Gemma 3)
    ({"hidden_size": 2048, "num_attention_heads": 32}, 64),                    # hidden / heads
    (DEEPSEEK_V3_ATTENTION, 192),                                              # MLA: nope + rope, not 56
    ({**DEEPSEEK_V3_ATTENTION, "head_dim": None}, 192),
])
def test_the_key_head_dim_of_a_config(config, expected):
    assert config_key_head_dim(config, config["num_attention_heads"], config["hidden_size"]) == expected


@pytest.mark.parametrize(("prefixed", "key_length", "expected"), [
    ({"attention.value_length": 128}, 128, None),       # the same as the keys'
    ({"attention.value_length": 128}, 192, 128),        # an old DeepSeek conversion: full per-head K and V
    (DEEPSEEK2_MLA_GGUF, 576, KEYS_ONLY),               # llama.cpp allocates no V tensor for MLA
    ({}, 64, None),
])
def test_the_value_head_dim_of_a_gguf(prefixed, key_length, expected):
    assert gguf_value_head_dim(prefixed, key_length) == expected


@pytest.mark.parametrize(("head_dim", "value_head_dim", "expected"), [(64, None, 64), (192, 128, 128), (576, 0, 0)])
def test_the_cached_value_width(head_dim, value_head_dim, expected):
    assert value_dim(head_dim, value_head_dim) == expected


def _write_mla_gguf(path: Path) -> dict:
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "deepseek2")
    meta = {"block_count": 2, "embedding_length": 256, "context_length": 4096, "vocab_size": 32,
            **DEEPSEEK2_MLA_GGUF}
    for key, value in meta.items():
        writer.add_uint32(f"deepseek2.{key}", value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return {"general.architecture": "deepseek2", **{f"deepseek2.{k}": v for k, v in meta.items()},
            "tokenizer.ggml.tokens": 32}


def test_card_and_planner_cost_an_mla_gguf_as_llama_cpp_caches_it(tmp_path: Path):
    path = tmp_path / "mla.gguf"
    meta = _write_mla_gguf(path)
    card = card_from_gguf("local/mla", meta, path.name, path.stat().st_size, local_path=str(tmp_path))
    assert (card.num_key_value_heads, card.head_dim, card.value_head_dim) == (1, 576, 0)
    assert card_kv_bytes(card) == planner_kv_bytes(model_meta_from_gguf(path)) == 576 * 2  # f16 keys only


@pytest.mark.parametrize(("model_type", "shape"), [
    # mlx-lm's deepseek_v3 caches the latent: one head of kv_lora_rank keys and rope values.
    ("deepseek_v3", (1, 512, 64)),
    ("kimi_k2", (1, 512, 64)),             # an alias of deepseek_v3
    # deepseek_v2 decompresses and caches per-head keys (nope + rope) and values.
    ("deepseek_v2", (128, 192, 128)),
])
def test_card_and_planner_cost_an_mla_config_as_mlx_lm_caches_it(model_type, shape):
    config = {"model_type": model_type, "num_hidden_layers": 2, "num_key_value_heads": 128,
              "vocab_size": 32, "max_position_embeddings": 4096, **DEEPSEEK_V3_ATTENTION}
    card = card_from_config("org/mla", config, 1000)
    assert (card.num_key_value_heads, card.head_dim, card.value_head_dim) == shape
    heads, keys, values = shape
    assert card_kv_bytes(card) == planner_kv_bytes(model_meta_from_config(config, 1000)) == heads * (keys + values) * 2


def test_every_latent_type_is_one_mlx_lm_loads():
    assert {"deepseek_v3", "glm4_moe_lite", "kimi_vl"} <= MLX_LATENT_KV_TYPES <= MLX_MODEL_TYPES
    assert "deepseek_v32" not in MLX_LATENT_KV_TYPES  # its indexer caches keys too: costed high, not low
