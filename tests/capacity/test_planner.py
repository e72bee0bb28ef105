"""Capacity planner: KV bytes for published shapes (hand-computed), policy cases, and the
three shape readers (card, config.json, GGUF header)."""

from __future__ import annotations

import pytest

from skulk.capacity.planner import (
    CapacityPlan,
    CapacityPolicy,
    CapacityShortfall,
    DeviceSnapshot,
    ModelMeta,
    ModelShapeError,
    kv_cache_bytes,
    model_meta_from_card,
    model_meta_from_config,
    model_meta_from_gguf,
    pattern_from_layer_flags,
    plan_capacity,
    usable_bytes,
)
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared import memory_estimate

KiB, MiB, GiB = 1024, 1024**2, 1024**3

# Llama-3.1-8B: 32 layers, 8 KV heads, head_dim 128, no window, 128k trained context.
LLAMA_8B = ModelMeta(num_layers=32, num_kv_heads=8, head_dim=128, weights_bytes=16 * GiB, trained_context_tokens=131072)
# Mistral-7B-v0.1: same KV shape, window 4096 on every layer, 32k positions.
MISTRAL_7B = ModelMeta(
    num_layers=32, num_kv_heads=8, head_dim=128, weights_bytes=14 * GiB, trained_context_tokens=32768, sliding_window=4096
)
# Gemma-3 4B text: 34 layers, pattern 6 (globals 5, 11, 17, 23, 29), window 1024, 4 KV heads x 256.
GEMMA3 = ModelMeta(
    num_layers=34,
    num_kv_heads=4,
    head_dim=256,
    weights_bytes=3 * GiB,
    trained_context_tokens=131072,
    sliding_window=1024,
    sliding_window_pattern=6,
)
PER_LAYER_TOKEN = 4096  # 2 (K,V) x 8 x 128 x 2 bytes, and 2 x 4 x 256 x 2 for Gemma 3


@pytest.mark.parametrize(
    ("meta", "context", "expected_bytes"),
    [
        (LLAMA_8B, 1, 128 * KiB),  # 32 x 4096
        (LLAMA_8B, 8192, 1 * GiB),
        (LLAMA_8B, 131072, 16 * GiB),
        (MISTRAL_7B, 2048, 32 * PER_LAYER_TOKEN * 2048),  # within the window: dense
        (MISTRAL_7B, 4096, 512 * MiB),
        (MISTRAL_7B, 32768, 512 * MiB),  # every layer capped at the window
        (GEMMA3, 512, 34 * PER_LAYER_TOKEN * 512),  # 71_303_168, within the window
        (GEMMA3, 1024, 34 * PER_LAYER_TOKEN * 1024),
        # 5 global layers x 32768 + 29 windowed layers x 1024
        (GEMMA3, 32768, 5 * PER_LAYER_TOKEN * 32768 + 29 * PER_LAYER_TOKEN * 1024),
        (GEMMA3, 32768, 792_723_456),
    ],
)
def test_kv_cache_bytes_for_published_shapes(meta: ModelMeta, context: int, expected_bytes: int) -> None:
    assert kv_cache_bytes(meta, context) == expected_bytes


def test_gemma3_global_layers_follow_the_card_rule() -> None:
    assert [i for i in range(34) if not GEMMA3.is_windowed_layer(i)] == [5, 11, 17, 23, 29]


def test_kv_agrees_with_placement_estimate_for_a_builtin_card() -> None:
    card = load_card(builtin_cards_dir() / "mlx-community--gemma-3-4b-it-4bit.toml")
    meta = model_meta_from_card(card)
    assert meta.sliding_window == 1024 and meta.sliding_window_pattern == 6 and meta.num_layers == 34
    for tokens in (100, 1024, 8192, 131072):
        assert kv_cache_bytes(meta, tokens) == memory_estimate.kv_cache_bytes(card, tokens)


# -- policy ---------------------------------------------------------------------------------

NO_SLACK = CapacityPolicy(reserve_bytes=0, headroom_fraction=0.0, min_hot_context_tokens=8192)


def ram(free: int, total: int | None = None) -> DeviceSnapshot:
    return DeviceSnapshot(kind="ram", total_bytes=total or free, free_bytes=free)


def vram(free: int, total: int | None = None) -> DeviceSnapshot:
    return DeviceSnapshot(kind="vram", total_bytes=total or free, free_bytes=free)


def test_usable_subtracts_reserve_and_headroom_of_total() -> None:
    device = DeviceSnapshot(kind="ram", total_bytes=16 * GiB, free_bytes=10 * GiB)
    assert usable_bytes(device, CapacityPolicy(reserve_bytes=1 * GiB, headroom_fraction=0.0625)) == 8 * GiB
    assert usable_bytes(device, CapacityPolicy(reserve_bytes=20 * GiB)) == 0


def test_dense_model_on_ram_holds_every_layer_and_caps_context_at_budget() -> None:
    meta = ModelMeta(32, 8, 128, weights_bytes=4 * GiB, trained_context_tokens=131072)
    plan = plan_capacity(meta, ram(8 * GiB), NO_SLACK)
    assert plan == CapacityPlan(
        device_kind="ram",
        usable_bytes=8 * GiB,
        gpu_layers=32,
        weights_resident_bytes=4 * GiB,
        kv_budget_bytes=4 * GiB,
        kv_bytes_per_token=128 * KiB,
        hot_kv_tokens=32768,  # 4 GiB / 128 KiB
        effective_context_tokens=32768,
        planner_effective_context_tokens=32768,
    )


def test_cold_budget_extends_only_the_planner_window() -> None:
    meta = ModelMeta(32, 8, 128, weights_bytes=4 * GiB, trained_context_tokens=131072)
    policy = CapacityPolicy(reserve_bytes=0, headroom_fraction=0.0, min_hot_context_tokens=8192, cold_budget_bytes=2 * GiB)
    plan = plan_capacity(meta, ram(8 * GiB), policy)
    assert isinstance(plan, CapacityPlan)
    assert plan.effective_context_tokens == 32768
    assert plan.planner_effective_context_tokens == 32768 + 16384


def test_effective_context_is_capped_at_trained_context() -> None:
    plan = plan_capacity(LLAMA_8B, ram(200 * GiB), NO_SLACK)
    assert isinstance(plan, CapacityPlan)
    assert plan.hot_kv_tokens == (184 * GiB) // (128 * KiB)
    assert plan.effective_context_tokens == plan.planner_effective_context_tokens == 131072


def test_interleaved_window_context_is_limited_by_global_layers_only() -> None:
    plan = plan_capacity(GEMMA3, ram(4 * GiB), NO_SLACK)  # 1 GiB of KV budget
    assert isinstance(plan, CapacityPlan)
    # (1 GiB - 29 windowed layers x 4096 x 1024) / (5 global layers x 4096)
    assert plan.hot_kv_tokens == (GiB - 29 * 4096 * 1024) // (5 * 4096) == 46489
    assert plan.effective_context_tokens == 46489
    # A dense estimate would have promised only 1 GiB / (34 x 4096) = 7710 tokens.
    assert plan.kv_bytes_per_token == 34 * 4096


def test_every_layer_windowed_serves_full_trained_context_once_the_window_fits() -> None:
    plan = plan_capacity(MISTRAL_7B, ram(14 * GiB + 512 * MiB), NO_SLACK)
    assert isinstance(plan, CapacityPlan)
    assert plan.effective_context_tokens == 32768


def test_vram_sheds_layers_to_guarantee_min_hot_context() -> None:
    # 16 GiB of weights: 512 MiB per layer; 8192 tokens cost 32 MiB per layer -> 544 MiB.
    device = DeviceSnapshot(kind="vram", total_bytes=10 * GiB, free_bytes=10 * GiB)
    policy = CapacityPolicy(reserve_bytes=1 * GiB, headroom_fraction=0.1, min_hot_context_tokens=8192)
    plan = plan_capacity(LLAMA_8B, device, policy)
    assert isinstance(plan, CapacityPlan)
    assert plan.usable_bytes == 8 * GiB
    assert plan.gpu_layers == 15  # 15 x 544 MiB = 8160 MiB <= 8192 MiB; 16 would not fit
    assert plan.weights_resident_bytes == 15 * 512 * MiB
    assert plan.hot_kv_tokens == (512 * MiB) // (15 * 4096) == 8738


def test_vram_keeps_every_layer_when_they_fit() -> None:
    plan = plan_capacity(LLAMA_8B, vram(24 * GiB), NO_SLACK)
    assert isinstance(plan, CapacityPlan)
    assert plan.gpu_layers == 32
    assert plan.hot_kv_tokens == 65536  # 8 GiB / 128 KiB


def test_vram_shedding_counts_windowed_layers_at_their_window() -> None:
    # Gemma 3 offloads the last layers; layers 29..33 are (G, W, W, W, W).
    meta = ModelMeta(34, 4, 256, weights_bytes=34 * 64 * MiB, trained_context_tokens=131072, sliding_window=1024, sliding_window_pattern=6)
    policy = CapacityPolicy(reserve_bytes=0, headroom_fraction=0.0, min_hot_context_tokens=32768)
    # 5 layers: weights 320 MiB + 1 global x 4096 x 32768 (128 MiB) + 4 windowed x 4 MiB = 464 MiB
    plan = plan_capacity(meta, vram(464 * MiB), policy)
    assert isinstance(plan, CapacityPlan)
    assert plan.gpu_layers == 5
    assert plan.hot_kv_tokens == 32768


@pytest.mark.parametrize(
    ("meta", "device", "reason", "needed", "available"),
    [
        (LLAMA_8B, ram(8 * GiB), "weights_exceed_memory", 16 * GiB, 8 * GiB),
        (
            ModelMeta(32, 8, 128, weights_bytes=7 * GiB + 512 * MiB, trained_context_tokens=131072),
            ram(8 * GiB),
            "min_hot_context_unfit",
            7 * GiB + 512 * MiB + 1 * GiB,  # weights + 8192 x 128 KiB
            8 * GiB,
        ),
        # One layer (512 MiB) + its KV at 8192 tokens (32 MiB) exceeds 500 MiB of VRAM.
        (LLAMA_8B, vram(500 * MiB), "min_hot_context_unfit", 544 * MiB, 500 * MiB),
    ],
)
def test_shortfall_names_reason_and_bytes(meta, device, reason, needed, available) -> None:
    result = plan_capacity(meta, device, NO_SLACK)
    assert result == CapacityShortfall(reason=reason, needed_bytes=needed, available_bytes=available, min_hot_context_tokens=8192)
    assert str(needed) in result.describe()


def test_min_hot_context_floor_is_capped_at_trained_context() -> None:
    meta = ModelMeta(2, 1, 64, weights_bytes=1 * MiB, trained_context_tokens=1024)
    plan = plan_capacity(meta, ram(1 * MiB + 1024 * 512), NO_SLACK)  # exactly 1024 tokens of KV
    assert isinstance(plan, CapacityPlan)
    assert plan.effective_context_tokens == 1024


# -- shape readers --------------------------------------------------------------------------

LLAMA_CONFIG = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
}
MISTRAL_CONFIG = {**LLAMA_CONFIG, "max_position_embeddings": 32768, "sliding_window": 4096}
QWEN2_CONFIG = {**LLAMA_CONFIG, "sliding_window": 131072, "use_sliding_window": False}
GEMMA3_CONFIG = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "text_config": {
        "num_hidden_layers": 34,
        "hidden_size": 2560,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
    },
}
GEMMA3_LAYER_TYPES = {
    **GEMMA3_CONFIG["text_config"],
    "sliding_window_pattern": None,
    "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)],
}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (LLAMA_CONFIG, LLAMA_8B),
        (MISTRAL_CONFIG, MISTRAL_7B),
        (QWEN2_CONFIG, LLAMA_8B),
        (GEMMA3_CONFIG, GEMMA3),
        (GEMMA3_LAYER_TYPES, GEMMA3),
    ],
)
def test_model_meta_from_config(config, expected: ModelMeta) -> None:
    assert model_meta_from_config(config, expected.weights_bytes) == expected


def test_config_without_layers_names_the_missing_key() -> None:
    with pytest.raises(ModelShapeError, match="num_hidden_layers"):
        model_meta_from_config({"hidden_size": 8}, 0)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [([True] * 4, None), ([True, False] * 3, 2), ([True] * 5 + [False] + [True] * 5 + [False], 6)],
)
def test_pattern_from_layer_flags(flags, expected) -> None:
    assert pattern_from_layer_flags(flags) == expected


def test_non_periodic_layout_is_rejected() -> None:
    with pytest.raises(ModelShapeError):
        pattern_from_layer_flags([False, True, True])


def test_model_meta_from_gguf_header(tmp_path) -> None:
    from skulk.models.tiny_models import TINY_SPEC, generate_tiny_model

    artifacts = generate_tiny_model(tmp_path, TINY_SPEC)
    meta = model_meta_from_gguf(artifacts.gguf_path)
    assert meta == ModelMeta(
        num_layers=TINY_SPEC.num_layers,
        num_kv_heads=TINY_SPEC.num_key_value_heads,
        head_dim=TINY_SPEC.head_dim,
        weights_bytes=artifacts.gguf_size_bytes,
        trained_context_tokens=TINY_SPEC.context_length,
    )


def _header_only_gguf(path, arch: str, **window) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_block_count(34)
    writer.add_head_count(8)
    writer.add_head_count_kv(4)
    writer.add_key_length(256)
    writer.add_embedding_length(2560)
    writer.add_context_length(131072)
    if "window" in window:
        writer.add_sliding_window(window["window"])
    if "pattern" in window:
        writer.add_sliding_window_pattern(window["pattern"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(
    ("arch", "window", "expected_window", "expected_pattern"),
    [
        ("gemma3", {"window": 1024}, 1024, 6),  # llama.cpp's hard-coded Gemma 3 interleave
        ("gemma3", {"window": 1024, "pattern": [(i + 1) % 6 != 0 for i in range(34)]}, 1024, 6),  # per-layer flags
        ("mistral3", {"window": 4096, "pattern": 2}, 4096, 2),
        ("llama", {"window": 4096}, 4096, None),  # a window with no known interleave: every layer
        ("llama", {}, None, None),
    ],
)
def test_model_meta_from_gguf_reads_the_window(tmp_path, arch, window, expected_window, expected_pattern) -> None:
    path = tmp_path / "header.gguf"
    _header_only_gguf(path, arch, **window)
    meta = model_meta_from_gguf(path)
    assert (meta.num_layers, meta.num_kv_heads, meta.head_dim, meta.trained_context_tokens) == (34, 4, 256, 131072)
    assert (meta.sliding_window, meta.sliding_window_pattern) == (expected_window, expected_pattern)
    assert meta.weights_bytes == path.stat().st_size


@pytest.mark.parametrize("copies", [1, 2, 4, 8])
def test_kv_copies_share_the_kv_budget_between_slots(copies):
    # A served engine whose every slot owns a context: the budget after the weights holds
    # 1/copies as many tokens per slot (LLAMA_8B: 128 KiB per token over 32 layers).
    device = DeviceSnapshot("vram", 80 * GiB, 80 * GiB)
    policy = CapacityPolicy(reserve_bytes=0, headroom_fraction=0.0)
    one = plan_capacity(LLAMA_8B, device, policy)
    plan = plan_capacity(LLAMA_8B, device, policy, kv_copies=copies)
    assert isinstance(one, CapacityPlan) and isinstance(plan, CapacityPlan)
    assert plan.hot_kv_tokens == one.kv_budget_bytes // (128 * KiB * copies)


def test_kv_copies_shed_layers_when_every_slots_minimum_context_does_not_fit():
    # 16 GiB of weights + 4 slots x the 4096-token minimum x 128 KiB (2 GiB) > 17.5 GiB of
    # VRAM, where one slot's 0.5 GiB fits: layers shed to RAM.
    device = DeviceSnapshot("vram", 35 * GiB // 2, 35 * GiB // 2)
    policy = CapacityPolicy(reserve_bytes=0, headroom_fraction=0.0)
    one = plan_capacity(LLAMA_8B, device, policy)
    four = plan_capacity(LLAMA_8B, device, policy, kv_copies=4)
    assert isinstance(one, CapacityPlan) and isinstance(four, CapacityPlan)
    assert four.gpu_layers < one.gpu_layers
    with pytest.raises(ModelShapeError):
        plan_capacity(LLAMA_8B, device, policy, kv_copies=0)
