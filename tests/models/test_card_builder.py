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
    parse_gguf_header,
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
        ({**LLAMA_CONFIG, "model_type": "gpt9"}, "model_type 'gpt9' is not one mlx-lm"),
        ({k: v for k, v in LLAMA_CONFIG.items() if k != "num_hidden_layers"}, "num_hidden_layers"),
        ({**LLAMA_CONFIG, "num_key_value_heads": 7}, "valid card"),
    ],
)
def test_card_from_config_errors(config, message):
    with pytest.raises(CardBuildError, match=message):
        card_from_config("org/m", config, 1000)


def _gguf(meta: dict, tensors: dict[str, tuple[int, ...]] | None = None) -> bytes:
    def string(s: str) -> bytes:
        raw = s.encode()
        return struct.pack("<Q", len(raw)) + raw

    tensors = tensors or {}
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for key, value in meta.items():
        out += string(key)
        if isinstance(value, str):
            out += struct.pack("<I", 8) + string(value)
        elif isinstance(value, list):
            out += struct.pack("<IIQ", 9, 8, len(value)) + b"".join(string(v) for v in value)
        else:
            out += struct.pack("<II", 4, value)
    for name, shape in tensors.items():
        out += string(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", 0, 0)
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


@pytest.mark.parametrize(("size", "expected"), [(811_000_000, 811_000_000), (None, "does not state the size"),
                                                 (0, "does not state the size")])
def test_a_gguf_card_with_a_projector_carries_its_size(size, expected):
    meta = parse_gguf_metadata(_gguf(QWEN_META))
    if isinstance(expected, str):
        with pytest.raises(CardBuildError, match=expected):
            card_from_gguf("Qwen/Q-GGUF", meta, "q-q4_k_m.gguf", 491_000_000, projector_file="mmproj-f16.gguf",
                           projector_size_bytes=size)
        return
    card = card_from_gguf("Qwen/Q-GGUF", meta, "q-q4_k_m.gguf", 491_000_000, projector_file="mmproj-f16.gguf",
                          projector_size_bytes=size)
    assert "vision" in card.capabilities
    assert (card.vision_weights_file, card.vision_weights_size_bytes) == ("mmproj-f16.gguf", expected)


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


MOE_META = {
    "general.architecture": "qwen3moe", "qwen3moe.block_count": 2, "qwen3moe.embedding_length": 64,
    "qwen3moe.attention.head_count": 4, "qwen3moe.attention.head_count_kv": 2, "qwen3moe.context_length": 2048,
    "qwen3moe.attention.key_length": 16, "qwen3moe.attention.value_length": 16,
    "qwen3moe.expert_count": 8, "qwen3moe.expert_used_count": 2, "tokenizer.ggml.tokens": ["a", "b"],
}
MOE_TENSORS = {
    "token_embd.weight": (64, 2), "blk.0.attn_q.weight": (64, 64),
    "blk.0.ffn_gate_inp.weight": (64, 8), "blk.0.ffn_up_exps.weight": (64, 32, 8),
    "blk.0.ffn_down_exps.weight": (32, 64, 8), "blk.0.ffn_up_shexp.weight": (64, 32),
}


def test_a_moe_card_counts_every_expert_and_the_active_share():
    header = parse_gguf_header(_gguf(MOE_META, MOE_TENSORS))
    assert header.tensor_elements["blk.0.ffn_up_exps.weight"] == 64 * 32 * 8
    card = card_from_gguf("local/moe", header.meta, "moe.gguf", 10, local_path="/m",
                          tensor_elements=header.tensor_elements)
    experts = 2 * 64 * 32 * 8
    total = 128 + 64 * 64 + 64 * 8 + experts + 64 * 32
    assert (card.family, card.num_experts, card.num_experts_used) == ("qwen3moe", 8, 2)
    assert (card.total_parameters, card.active_parameters) == (total, total - experts + experts // 4)
    assert card.value_head_dim is None  # the same as the keys'


def test_a_split_gguf_has_no_parameter_count_from_its_first_shard():
    header = parse_gguf_header(_gguf({**MOE_META, "split.count": 3}, MOE_TENSORS))
    card = card_from_gguf("local/moe", header.meta, "moe-00001-of-00003.gguf", 10, local_path="/m",
                          tensor_elements=header.tensor_elements)
    assert card.total_parameters is None and card.num_experts == 8


def test_value_heads_wider_than_keys_are_kept():
    meta = parse_gguf_metadata(_gguf({**MOE_META, "qwen3moe.attention.value_length": 32}))
    card = card_from_gguf("local/moe", meta, "moe.gguf", 10, local_path="/m")
    assert (card.head_dim, card.value_head_dim) == (16, 32)


@pytest.mark.parametrize(("arch", "message"), [
    ("qwen3_moe", "architecture 'qwen3_moe' is not one the llama.cpp of llama-cpp-python"),  # an MLX name
    ("clip", "architecture 'clip' is not one"),  # llama-quantize's placeholder, no model
    (None, "names no architecture"),
])
def test_a_gguf_architecture_the_engine_cannot_load_is_refused_by_name(arch, message):
    meta = {k.replace("qwen3moe", str(arch)): v for k, v in MOE_META.items()}
    meta["general.architecture"] = arch
    with pytest.raises(CardBuildError, match=message):
        card_from_gguf("local/x", meta, "x.gguf", 10, local_path="/m")


@pytest.mark.parametrize(("config", "expected"), [
    ({**LLAMA_CONFIG, "model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8},
     {"family": "qwen3_moe", "num_experts": 128, "num_experts_used": 8}),
    ({**LLAMA_CONFIG, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2},
     {"family": "mixtral", "num_experts": 8, "num_experts_used": 2}),
    ({**LLAMA_CONFIG, "model_type": "deepseek_v3", "n_routed_experts": 256, "num_experts_per_tok": 8,
      "v_head_dim": 128}, {"family": "deepseek_v3", "num_experts": 256, "value_head_dim": 128}),
    ({**LLAMA_CONFIG, "model_type": "olmo2"}, {"family": "olmo2", "num_experts": None}),
])
def test_mlx_cards_of_any_model_type_mlx_lm_loads(config, expected):
    card = card_from_config("org/m", config, 1000)
    for field, value in expected.items():
        assert getattr(card, field) == value, field


@pytest.mark.parametrize(("arch", "template", "expected"), [
    ("qwen3moe", "{{ '<|start|>assistant<|channel|>final<|message|>' }}", ("harmony", None)),
    ("gpt-oss", None, ("harmony", None)),
    ("qwen3moe", "{% if thinking %}<think>\n\n</think>{% endif %}", ("think_tags", "<think>")),
    ("qwen3moe", "{{ messages[0].content }}", ("none", None)),
])
def test_the_reasoning_format_comes_from_the_models_own_template(arch, template, expected):
    meta = {k.replace("qwen3moe", arch): v for k, v in MOE_META.items()}
    meta["general.architecture"] = arch
    if template is not None:
        meta["tokenizer.chat_template"] = template
    card = card_from_gguf("local/r", parse_gguf_metadata(_gguf(meta)), "r.gguf", 10, local_path="/m")
    assert (card.reasoning.format, card.reasoning.start_tag) == expected
    assert ("thinking" in card.capabilities) == (expected[0] != "none")


@pytest.mark.parametrize(("template", "expected"), [
    (None, ("none", (), "none")),
    ("{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{% endif %}"
     "{{ '<tool_call>' }}", ("think_tags", ("enable_thinking",), "hermes")),
    ("<|channel|>{{ reasoning_effort }}", ("harmony", ("reasoning_effort",), "harmony")),
])
def test_an_mlx_card_reads_its_chat_template(template, expected):
    card = card_from_config("org/q", {**LLAMA_CONFIG, "model_type": "qwen3"}, 1000, chat_template=template)
    assert (card.reasoning.format, card.reasoning.switches, card.tooling.tool_call_format) == expected


def test_an_mlx_gpt_oss_card_reads_harmony():
    card = card_from_config("org/g", {**LLAMA_CONFIG, "model_type": "gpt_oss", "num_local_experts": 32,
                                      "num_experts_per_tok": 4}, 1000)
    assert card.reasoning.format == "harmony" and "thinking" in card.capabilities



@pytest.mark.parametrize(("template", "family", "expected"), [
    ("{{ '<tool_call>' }}{{ '<think>' }}{{ '</think>' }}", "qwen3moe", ("hermes", "think_tags")),
    ("{{ '[TOOL_CALLS]' }}", "qwen3moe", ("mistral", "none")),
    ("{{ '<|python_tag|>' }}", "qwen3moe", ("llama3_json", "none")),
    (None, "gpt-oss", ("harmony", "harmony")),
    ("{{ messages }}", "qwen3moe", ("none", "none")),
])
def test_the_tool_call_format_comes_from_the_template_too(template, family, expected):
    meta = {k.replace("qwen3moe", family): v for k, v in MOE_META.items()}
    meta["general.architecture"] = family
    if template is not None:
        meta["tokenizer.chat_template"] = template
    card = card_from_gguf("local/t", parse_gguf_metadata(_gguf(meta)), "t.gguf", 10, local_path="/m")
    assert (card.tooling.tool_call_format, card.reasoning.format) == expected
    assert ("tools" in card.capabilities) == (expected[0] != "none")


def test_every_card_tool_format_has_a_parser():
    from typing import get_args

    from skulk.api.tool_calls import BY_CARD_FORMAT
    from skulk.shared.types.cards import ToolCallFormat

    assert set(get_args(ToolCallFormat)) - {"none"} == set(BY_CARD_FORMAT)


@pytest.mark.parametrize(("template", "family", "switches"), [
    ("{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{% endif %}", "qwen3moe",
     ("enable_thinking",)),
    ("{% if thinking %}<think>{% else %}</think>{% endif %}", "qwen3moe", ("thinking",)),
    ("<|channel|>{{ reasoning_effort }}", "gpt-oss", ("reasoning_effort",)),
    ("<think></think>", "qwen3moe", ()),
])
def test_reasoning_switches_come_from_the_template(template, family, switches):
    meta = {k.replace("qwen3moe", family): v for k, v in MOE_META.items()}
    meta["general.architecture"] = family
    meta["tokenizer.chat_template"] = template
    card = card_from_gguf("local/s", parse_gguf_metadata(_gguf(meta)), "s.gguf", 10, local_path="/m")
    assert card.reasoning.switches == switches


def test_an_mlx_config_with_a_vision_tower_of_a_family_mlx_runs_builds_a_seeing_card(tmp_path):
    import json

    from skulk.models.tiny_models import TINY_SPEC, TINY_VISION_SPEC, write_mlx_vlm

    write_mlx_vlm(tmp_path / "hf", TINY_SPEC, TINY_VISION_SPEC)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    card = card_from_config("org/tiny-llava", config, 1000)
    assert card.family == "llava" and "vision" in card.capabilities
    assert card.vocab_size == TINY_SPEC.vocab_size + 1 and card.num_layers == TINY_SPEC.num_layers
    # A tower of a family MLX's vision path has not been shown to run: no vision advertised.
    qwen = {**LLAMA_CONFIG, "model_type": "qwen2_vl", "vision_config": {"model_type": "qwen2_vl"}}
    assert "vision" not in card_from_config("org/qwen-vl", qwen, 1000).capabilities
    assert "vision" not in card_from_config("org/m", LLAMA_CONFIG, 1000).capabilities


def test_an_mlx_gemma3_config_with_its_tower_builds_a_seeing_card(tmp_path):
    import json

    from skulk.models.tiny_models import GEMMA3_TOKENS, TINY_SPEC, TINY_VISION_SPEC, write_mlx_vlm_gemma3

    write_mlx_vlm_gemma3(tmp_path / "hf", TINY_SPEC, TINY_VISION_SPEC)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    card = card_from_config("org/tiny-gemma3", config, 1000)
    assert card.family == "gemma3" and "vision" in card.capabilities
    assert card.vocab_size == TINY_SPEC.vocab_size + len(GEMMA3_TOKENS) and card.num_layers == TINY_SPEC.num_layers


def test_an_mlx_qwen2_5_vl_config_with_its_tower_builds_a_seeing_card(tmp_path):
    import json

    from skulk.models.tiny_models import QWEN2_5_VL_TOKENS, TINY_SPEC, TINY_VISION_SPEC, write_mlx_vlm_qwen2_5_vl

    write_mlx_vlm_qwen2_5_vl(tmp_path / "hf", TINY_SPEC, TINY_VISION_SPEC)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    card = card_from_config("org/tiny-qwen-vl", config, 1000)
    assert card.family == "qwen2_5_vl" and "vision" in card.capabilities
    assert card.vocab_size == TINY_SPEC.vocab_size + len(QWEN2_5_VL_TOKENS) and card.num_layers == TINY_SPEC.num_layers
