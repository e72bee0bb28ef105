"""Building cards from config.json and GGUF headers, and the filename-search helpers: pure."""

from __future__ import annotations

import struct

import pytest

from skulk.models.card_builder import (
    CardBuildError,
    GgufTruncated,
    broadening_prefixes,
    card_from_config,
    card_from_gguf,
    is_filename_query,
    local_model_id,
    match_basename,
    parse_gguf_metadata,
)
from skulk.models.hub_files import RepoFile

LLAMA_CONFIG = {
    "model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256, "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16", "quantization": {"group_size": 64, "bits": 4},
}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (LLAMA_CONFIG, {"family": "llama", "num_layers": 16, "head_dim": 64, "quantization": "4bit", "sliding_window": None}),
        ({**LLAMA_CONFIG, "quantization": None, "head_dim": None}, {"quantization": "bf16", "head_dim": 64}),
        ({**LLAMA_CONFIG, "num_key_value_heads": None}, {"num_key_value_heads": 32}),
        # qwen2 configs carry a sliding_window they do not use
        ({**LLAMA_CONFIG, "model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False},
         {"family": "qwen2", "sliding_window": None}),
        ({**LLAMA_CONFIG, "model_type": "gemma2", "sliding_window": 4096},
         {"family": "gemma2", "sliding_window": 4096, "sliding_window_pattern": 2}),
        # multimodal Gemma 3: the language model's shape is under text_config
        ({"model_type": "gemma3", "text_config": {**LLAMA_CONFIG, "model_type": "gemma3_text", "num_hidden_layers": 34,
                                                   "sliding_window": 1024, "sliding_window_pattern": 6}},
         {"family": "gemma3", "num_layers": 34, "sliding_window": 1024, "sliding_window_pattern": 6}),
    ],
)
def test_card_from_config(config, expected):
    card = card_from_config("org/m", config, 1000)
    assert card.placement.compatible_backends[0] == "mlx" and card.source == "huggingface"
    for field, value in expected.items():
        assert getattr(card, field) == value, field


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**LLAMA_CONFIG, "model_type": "mamba"}, "not supported"),
        ({k: v for k, v in LLAMA_CONFIG.items() if k != "num_hidden_layers"}, "num_hidden_layers"),
        ({**LLAMA_CONFIG, "num_key_value_heads": 7}, "valid card"),
    ],
)
def test_card_from_config_errors(config, message):
    with pytest.raises(CardBuildError, match=message):
        card_from_config("org/m", config, 1000)


def _gguf(meta: dict) -> bytes:
    def string(s: str) -> bytes:
        raw = s.encode()
        return struct.pack("<Q", len(raw)) + raw

    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(meta))
    for key, value in meta.items():
        out += string(key)
        if isinstance(value, str):
            out += struct.pack("<I", 8) + string(value)
        elif isinstance(value, list):
            out += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(string(v) for v in value)
        else:
            out += struct.pack("<II", 4, value)
    return out


QWEN_META = {
    "general.architecture": "qwen2", "qwen2.block_count": 24, "qwen2.embedding_length": 896,
    "qwen2.attention.head_count": 14, "qwen2.attention.head_count_kv": 2, "qwen2.context_length": 32768,
    "tokenizer.ggml.tokens": ["a", "b", "c"],
}


def test_parse_gguf_metadata_keeps_array_lengths():
    meta = parse_gguf_metadata(_gguf(QWEN_META))
    assert meta == {**QWEN_META, "tokenizer.ggml.tokens": 3}


@pytest.mark.parametrize(
    ("data", "error"),
    [(b"GGML" + b"\0" * 20, CardBuildError), (_gguf(QWEN_META)[:40], GgufTruncated), (b"GG", GgufTruncated)],
)
def test_parse_gguf_metadata_errors(data, error):
    with pytest.raises(error):
        parse_gguf_metadata(data)


def test_card_from_gguf():
    card = card_from_gguf("Qwen/Q-GGUF", parse_gguf_metadata(_gguf(QWEN_META)), "q-q4_k_m.gguf", 491_000_000,
                          revision="a" * 40)
    assert (card.family, card.num_layers, card.hidden_size, card.head_dim, card.vocab_size) == ("qwen2", 24, 896, 64, 3)
    assert card.gguf_file == "q-q4_k_m.gguf" and card.quantization == "Q4_K_M" and card.is_gguf
    assert card.source_revision == "a" * 40
    local = card_from_gguf("local/q", parse_gguf_metadata(_gguf(QWEN_META)), "q.gguf", 5, local_path="/m")
    assert local.source == "local-path" and local.local_path == "/m" and local.quantization == "gguf"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
         ("Meta-Llama-3.1-8B-Instruct-Q4_K_M", "Meta-Llama-3.1-8B-Instruct-Q4_K", "Meta-Llama-3.1-8B-Instruct-Q4",
          "Meta-Llama-3.1-8B-Instruct")),
        ("dir/model-Q8_0-00001-of-00002.gguf", ("model-Q8_0", "model-Q8", "model")),
        ("ab-c.gguf", ("ab-c",)),
    ],
)
def test_broadening_prefixes(query, expected):
    assert broadening_prefixes(query) == expected


@pytest.mark.parametrize(("query", "expected"), [("m.gguf", True), (" M.GGUF ", True), ("llama", False)])
def test_is_filename_query(query, expected):
    assert is_filename_query(query) is expected


def test_match_basename_prefers_the_shallowest_exact_match():
    files = [RepoFile("sub/m-Q4.gguf"), RepoFile("m-Q4.gguf"), RepoFile("m-Q4.gguf.part")]
    assert match_basename(files, "m-Q4.gguf") == "m-Q4.gguf"
    assert match_basename(files, "other.gguf") is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [("model", "local/model"), ("My Model (v2)", "local/My-Model-v2"), ("a--b..c", "local/a-b.c"), ("..", "local/model")],
)
def test_local_model_id(name, expected):
    assert local_model_id(name) == expected
