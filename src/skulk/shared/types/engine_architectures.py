"""Which architectures the engines we ship can load: generated, never edited by hand.

Written by scripts/gen_engine_architectures.py from llama-cpp-python 0.3.36's vendored
llama.cpp (`LLM_ARCH_NAMES`) and mlx-lm 0.32.2's model modules. A model card is built only
for an architecture listed here (`skulk.models.card_builder`); sharding across nodes is a
separate, per-engine question (`skulk.shared.types.engines`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

LLAMA_CPP_VERSION = "0.3.36"
"""The llama-cpp-python release whose llama.cpp the table was read from."""

LLAMA_CPP_ARCHITECTURES: frozenset[str] = frozenset({
    "afmoe", "apertus", "arcee", "arctic", "arwkv7", "baichuan", "bailingmoe", "bailingmoe2", "bailingmoe3",
    "bert", "bitnet", "bloom", "chameleon", "chatglm", "codeshell", "cogvlm", "cohere2", "cohere2moe",
    "command-r", "dbrx", "deci", "deepseek", "deepseek2", "deepseek2-ocr", "deepseek32", "deepseek4",
    "dflash", "dots1", "dots3note", "dream", "eagle3", "ernie4_5", "ernie4_5-moe", "eurobert", "exaone",
    "exaone-moe", "exaone4", "falcon", "falcon-h1", "gemma", "gemma-embedding", "gemma2", "gemma3",
    "gemma3n", "gemma4", "gemma4-assistant", "glm-dsa", "glm4", "glm4moe", "glm5-next", "gpt-oss", "gpt2",
    "gptj", "gptneox", "granite", "granite_swa", "granitehybrid", "granitemoe", "graniteswitch", "grok",
    "grovemoe", "hrm_text", "hunyuan-dense", "hunyuan-moe", "hunyuan_vl", "hy_v3", "hy_v4", "internlm2",
    "jais", "jais2", "jamba", "jina-bert-v2", "jina-bert-v3", "kimi-k3", "kimi-linear", "laguna", "lfm2",
    "lfm2moe", "llada", "llada-moe", "llama", "llama-embed", "llama4", "maincoder", "mamba", "mamba2",
    "maple", "mellum", "mimo2", "minicpm", "minicpm3", "minimax-01", "minimax-m2", "minimax-m3", "mistral3",
    "mistral4", "modern-bert", "mpt", "muse-glimmer", "nanbeige", "nemotron", "nemotron_h", "nemotron_h_moe",
    "neo-bert", "nomic-bert", "nomic-bert-moe", "olmo", "olmo2", "olmoe", "openelm", "orion", "paddleocr",
    "pangu-embedded", "phi2", "phi3", "phimoe", "plamo", "plamo2", "plamo3", "plm", "pockettts", "qwen",
    "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen35", "qwen35moe", "qwen3moe", "qwen3next", "qwen3tts",
    "qwen3vl", "qwen3vlmoe", "qwen4exp", "refact", "rnd1", "rwkv6", "rwkv6qwen2", "rwkv7", "seed_oss",
    "smallthinker", "smollm3", "spark2_5", "stablelm", "starcoder", "starcoder2", "step35", "t5",
    "t5encoder", "talkie", "wavtokenizer-dec", "xverse",
})
"""GGUF `general.architecture` values that llama.cpp loads."""

MLX_LM_VERSION = "0.32.2"
"""The mlx-lm release whose model modules the table was read from."""

MLX_MODEL_TYPES: frozenset[str] = frozenset({
    "Klear", "afm7", "afmoe", "apertus", "baichuan_m1", "bailing_hybrid", "bailing_moe",
    "bailing_moe_linear", "bailing_moe_v3", "bitnet", "cohere", "cohere2", "dbrx", "deepseek", "deepseek_v2",
    "deepseek_v3", "deepseek_v32", "deepseek_v41", "dots1", "ernie4_5", "ernie4_5_moe", "exaone", "exaone4",
    "exaone_moe", "falcon_h1", "gear", "gemma", "gemma2", "gemma3", "gemma3_text", "gemma3n", "gemma4",
    "gemma4_text", "glm", "glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "gpt2", "gpt_bigcode",
    "gpt_neox", "gpt_oss", "gptj", "granite", "granitemoe", "granitemoehybrid", "helium", "hunyuan",
    "hunyuan_v1_dense", "internlm2", "internlm3", "iquestloopcoder", "jamba", "kimi_k25", "kimi_k3",
    "kimi_linear", "kimi_vl", "laguna", "lfm2", "lfm2-vl", "lfm2_moe", "lille-130m", "llama", "llama4",
    "llama4_text", "longcat_flash", "longcat_flash_ngram", "mamba", "mamba2", "mellum", "mimo",
    "mimo_v2_flash", "minicpm", "minicpm3", "minimax", "minimax_m3_vl", "ministral3", "mistral3", "mistral4",
    "mixtral", "muse_glimmer", "muse_spark", "nanbeige", "nanochat", "nemotron", "nemotron-nas",
    "nemotron_h", "olmo2", "olmo3", "olmo_hybrid", "olmoe", "openelm", "phi", "phi3", "phi3small", "phimoe",
    "phixtral", "pixtral", "plamo", "plamo2", "plamo3", "prism_hadamard_qwen35", "qwen", "qwen2",
    "qwen2_moe", "qwen2_vl", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_moe", "qwen3_next", "qwen3_vl",
    "qwen3_vl_moe", "recurrent_gemma", "rwkv7", "seed_oss", "smollm3", "solar_open", "spark2_5", "stablelm",
    "starcoder2", "step3p5", "talkie", "telechat3", "youtu_llm",
})
"""config.json `model_type` values mlx-lm has a model class for."""

MLX_MODEL_REMAPPING: Mapping[str, str] = MappingProxyType({
    "deepseek_v41_text": "deepseek_v41",
    "falcon_mamba": "mamba",
    "gemma4_unified": "gemma4",
    "iquestcoder": "llama",
    "joyai_llm_flash": "deepseek_v3",
    "kimi_k2": "deepseek_v3",
    "llava": "mistral3",
    "minimax_m2": "minimax",
    "mistral": "llama",
    "phi-msft": "phixtral",
    "qwen2_5_vl": "qwen2_vl",
    "xverse": "llama",
})
"""mlx-lm's aliases: a config's `model_type` that loads through another type's class."""

MLX_LATENT_KV_TYPES: frozenset[str] = frozenset({
    "bailing_hybrid", "bailing_moe_v3", "deepseek_v3", "glm4_moe_lite", "kimi_k25", "kimi_k3", "kimi_linear",
    "kimi_vl", "longcat_flash", "longcat_flash_ngram",
})
"""Types whose mlx-lm attention caches the MLA latent (`kv_lora_rank` keys and
`qk_rope_head_dim` values, one head) rather than per-head keys and values."""

__all__ = ["LLAMA_CPP_ARCHITECTURES", "LLAMA_CPP_VERSION", "MLX_LATENT_KV_TYPES", "MLX_LM_VERSION",
           "MLX_MODEL_REMAPPING", "MLX_MODEL_TYPES"]
