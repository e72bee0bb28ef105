"""The planner on a shard (layer span, weight share) and on a placed instance: hand-computed
budgets, the tightest rank wins, and the stamped window's bounds."""

from __future__ import annotations

from fractions import Fraction

import pytest

from skulk.capacity.instance import plan_instance, stamped_context_tokens
from skulk.capacity.planner import (
    CapacityPlan,
    CapacityPolicy,
    DeviceSnapshot,
    ModelMeta,
    ModelShapeError,
    plan_capacity,
)
from skulk.models.cards import builtin_cards_dir, resolve_cards
from skulk.shared.memory_estimate import NodeMemoryTotals
from skulk.shared.types.instances import ShardAssignment

MiB, GiB = 1024**2, 1024**3
NO_SLACK = CapacityPolicy(reserve_bytes=0, headroom_fraction=0.0, min_hot_context_tokens=1024)
# 32 layers x 4096 bytes of KV per token per layer (128 KiB/token whole), 16 GiB of weights.
LLAMA_8B = ModelMeta(num_layers=32, num_kv_heads=8, head_dim=128, weights_bytes=16 * GiB, trained_context_tokens=131072)
CARDS = resolve_cards(builtin_cards_dir(), None).cards
LLAMA_1B = CARDS["mlx-community/Llama-3.2-1B-Instruct-4bit"]
GGUF = CARDS["bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"]


def ram(free: int, total: int | None = None) -> DeviceSnapshot:
    return DeviceSnapshot("ram", total or free, free)


@pytest.mark.parametrize(
    ("name", "layers", "share", "free", "weights", "hot"),
    [
        # Half the layers: 8 GiB of weights, 64 KiB of KV per token; 4 GiB left -> 65536 tokens.
        ("pipeline stage", range(0, 16), Fraction(1), 12 * GiB, 8 * GiB, 65536),
        ("last stage", range(16, 32), Fraction(1), 12 * GiB, 8 * GiB, 65536),
        # Tensor rank of two: half of every layer's weights and KV, the same arithmetic.
        ("tensor rank", range(0, 32), Fraction(1, 2), 12 * GiB, 8 * GiB, 65536),
        ("whole model (the default)", range(0, 32), Fraction(1), 20 * GiB, 16 * GiB, 32768),
    ],
)
def test_shard_plan(name, layers, share, free, weights, hot):
    plan = plan_capacity(LLAMA_8B, ram(free), NO_SLACK, layers=layers, share=share)
    assert isinstance(plan, CapacityPlan)
    assert (plan.weights_resident_bytes, plan.hot_kv_tokens, plan.effective_context_tokens) == (weights, hot, hot)
    assert plan.gpu_layers == len(layers)


def test_shard_plan_on_vram_sheds_layers_within_its_span():
    # 8 layers of 512 MiB weights each on a 3 GiB device: 5 layers fit
    # with 1024 hot tokens of KV, 6 do not (6 x 512 MiB = 3 GiB of weights alone).
    plan = plan_capacity(LLAMA_8B, DeviceSnapshot("vram", 3 * GiB, 3 * GiB), NO_SLACK, layers=range(8, 16))
    assert isinstance(plan, CapacityPlan) and plan.gpu_layers == 5


@pytest.mark.parametrize(
    ("layers", "share"), [(range(0, 33), Fraction(1)), (range(4, 4), Fraction(1)), (range(0, 8), Fraction(0))]
)
def test_shard_plan_rejects_impossible_shares(layers, share):
    with pytest.raises(ModelShapeError):
        plan_capacity(LLAMA_8B, ram(GiB), NO_SLACK, layers=layers, share=share)


def shard(node, rank, world, start, end, backend="mlx-cpu"):
    return ShardAssignment(node_id=node, runner_id=f"r{rank}", rank=rank, world_size=world, start_layer=start,
                           end_layer=end, backend=backend)


def test_instance_takes_the_tightest_rank():
    shards = [shard("a", 0, 2, 0, 8), shard("b", 1, 2, 8, 16)]
    capacity = plan_instance(LLAMA_1B, shards, {"a": ram(8 * GiB), "b": ram(2 * GiB)})
    a, b = capacity.shards
    assert b.effective_context_tokens < a.effective_context_tokens
    assert capacity.effective_context_tokens == b.effective_context_tokens
    assert capacity.hot_kv_tokens == min(a.hot_kv_tokens, b.hot_kv_tokens)
    assert (capacity.gpu_layers, capacity.num_layers) == (16, 16)


def test_a_rank_without_a_reading_or_without_room_reports_why():
    shards = [shard("a", 0, 2, 0, 8), shard("b", 1, 2, 8, 16)]
    capacity = plan_instance(LLAMA_1B, shards, {"a": ram(64 * MiB)})
    assert capacity.effective_context_tokens == 0
    assert "no memory reading" in capacity.shards[1].shortfall
    assert "need" in capacity.shards[0].shortfall


def test_two_ranks_on_one_node_split_its_memory():
    one = plan_instance(LLAMA_1B, [shard("a", 0, 1, 0, 16)], {"a": ram(8 * GiB)})
    two = plan_instance(LLAMA_1B, [shard("a", 0, 2, 0, 8), shard("a", 1, 2, 8, 16)], {"a": ram(8 * GiB)})
    assert two.effective_context_tokens < one.effective_context_tokens * 1.01


@pytest.mark.parametrize(
    ("name", "card", "backend", "free", "expected"),
    [
        ("MLX: the planner's window", LLAMA_1B, "mlx-cpu", 4 * GiB, "planner"),
        ("MLX: never below the admission floor", LLAMA_1B, "mlx-cpu", int(2.1 * GiB), 8192),
        ("MLX: capped at the card", LLAMA_1B, "mlx-cpu", 400 * GiB, 131072),
        # llama.cpp commits its window at load; without discrete VRAM it keeps the floor.
        ("llama.cpp on CPU keeps the floor", GGUF, "llama_cpp-cpu", 400 * GiB, 8192),
    ],
)
def test_stamped_context(name, card, backend, free, expected):
    shards = [shard("a", 0, 1, 0, card.num_layers, backend)]
    capacity = plan_instance(card, shards, {"a": ram(free, 2 * free)})
    stamped = stamped_context_tokens(card, shards, {"a": NodeMemoryTotals(ram_total_bytes=2 * free)}, capacity)
    assert stamped == (capacity.effective_context_tokens if expected == "planner" else expected)


@pytest.mark.parametrize(("resident", "hot"), [
    (0, 65536),               # 4 GiB left after 8 GiB of weights, 64 KiB per token
    (1 * GiB, 49152),         # a 1 GiB projector beside the layers: 3 GiB left
    (4 * GiB, None),          # nothing left for the minimum hot context
])
def test_bytes_resident_beside_the_layers_come_off_the_budget(resident, hot):
    plan = plan_capacity(LLAMA_8B, ram(12 * GiB), NO_SLACK, layers=range(0, 16), resident_bytes=resident)
    if hot is None:
        assert not isinstance(plan, CapacityPlan)
    else:
        assert isinstance(plan, CapacityPlan) and plan.hot_kv_tokens == hot


def test_only_the_rank_that_loads_the_projector_plans_around_it():
    seeing = GGUF.model_validate({**GGUF.model_dump(), "capabilities": [*GGUF.capabilities, "vision"],
                                  "vision_weights_repo": GGUF.model_id, "vision_weights_file": "mmproj-f16.gguf",
                                  "vision_weights_size_bytes": 800_000_000})
    shards = [ShardAssignment(node_id=n, runner_id=f"r{i}", rank=i, world_size=2, start_layer=16 * i,
                              end_layer=16 * (i + 1), backend="llama_cpp-cpu") for i, n in enumerate("ab")]
    devices = {n: ram(12 * GiB) for n in "ab"}
    plain, vlm = (plan_instance(card, shards, devices, NO_SLACK) for card in (GGUF, seeing))
    assert vlm.shards[0].hot_kv_tokens < plain.shards[0].hot_kv_tokens
    assert vlm.shards[1].hot_kv_tokens == plain.shards[1].hot_kv_tokens
    assert vlm.shards[0].admitted_bytes == plain.shards[0].admitted_bytes + 800_000_000
