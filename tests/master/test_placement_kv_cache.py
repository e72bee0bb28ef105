"""A placement's KV cache type (`skulk.shared.types.kv_cache`): counted at its quantized size
by placement and the capacity planner (a longer window in the same memory), stamped on every
shard, chosen request > card > node, kept by repairs and restores, and refused by name where
no engine of the card can hold it."""

import itertools

import pytest

from skulk.datadir.config import ConfigError, parse_config
from skulk.facts.nvml import NvmlDevice, gpu_readings
from skulk.master.placement import KvCacheTypeUnsupported, PlacementRequest, place, preview
from skulk.shared.intent import placement_intent
from skulk.shared.memory_estimate import shard_footprint
from skulk.shared.types.kv_cache import (
    KV_ELEMENT_BYTES,
    chosen_kv_cache_type,
    kv_cache_type_refusal,
    parse_kv_cache_type,
)
from skulk.shared.types.state import NodeInfo, State
from tests.master.test_placement import LLAMA_1B, MLX_CPU, res
from tests.master.test_vram import GB, GGUF_8B, node

GPU_12GB = node(gpu_readings([NvmlDevice(0, "NVIDIA X", 12 * GB, 11 * GB)]))
STATE = State(nodes={"a": NodeInfo(node_id="a", node_name="a", version="0")})


def ids():
    counter = itertools.count()
    return lambda: f"id{next(counter)}"


def windows(kv_type: str) -> tuple[int, int]:
    (option,) = preview(GGUF_8B, STATE, {"a": GPU_12GB}, sharding="Pipeline", kv_cache_type=kv_type)
    assert option.kv_cache_type == kv_type
    return option.context_token_limit, option.capacity.hot_kv_tokens


def test_a_quantized_cache_admits_a_longer_window_in_the_same_memory():
    f16, q8, q4 = windows("f16"), windows("q8_0"), windows("q4_0")
    # The KV bytes per token shrink 64/34 (q8_0) and 64/18 (q4_0); the window grows by that
    # ratio (the weights' share of the memory is the same).
    for (window, hot), ratio in ((q8, 64 / 34), (q4, 64 / 18)):
        assert window / f16[0] == pytest.approx(ratio, rel=0.01) and hot / f16[1] == pytest.approx(ratio, rel=0.01)


def mlx_windows(kv_type: str) -> tuple[int, int]:
    # 3 GB free: the 1B model's weights (~1.6 GB with overhead) leave a KV budget smaller
    # than its whole 128k window, so memory, not the card, bounds the window.
    (option,) = preview(LLAMA_1B, STATE, {"a": res("a", 3 * GB, MLX_CPU)}, sharding="Pipeline",
                        kv_cache_type=kv_type)
    assert option.kv_cache_type == kv_type and [s.backend for s in option.shards] == ["mlx-cpu"]
    return option.context_token_limit, option.capacity.hot_kv_tokens


def test_an_mlx_card_previews_a_longer_window_with_a_quantized_cache():
    """LLAMA_1B's heads are 64 wide: MLX groups them by 64, 34/32 bytes an element at 8 bits
    and 18/32 at 4, so the window grows 64/34 and 64/18 as on llama.cpp."""
    f16, q8, q4 = mlx_windows("f16"), mlx_windows("q8_0"), mlx_windows("q4_0")
    assert LLAMA_1B.head_dim == 64 and f16[0] < LLAMA_1B.context_length
    for (window, hot), ratio in ((q8, 64 / 34), (q4, 64 / 18)):
        assert window / f16[0] == pytest.approx(ratio, rel=0.01) and hot / f16[1] == pytest.approx(ratio, rel=0.01)


def test_the_footprint_counts_and_names_the_quantized_cache():
    f16 = shard_footprint(GGUF_8B, range(GGUF_8B.num_layers), 8192)
    q8 = shard_footprint(GGUF_8B, range(GGUF_8B.num_layers), 8192, kv_type="q8_0")
    assert q8.kv_bytes * 64 == f16.kv_bytes * 34 and "8192 tokens q8_0" in q8.describe()


def test_every_shard_is_stamped_with_the_chosen_type_and_a_repair_keeps_it():
    card = GGUF_8B.model_copy(update={"runtime": GGUF_8B.runtime.model_copy(update={"kv_cache_backend": "q4_0"})})
    cases = [
        (GGUF_8B, PlacementRequest(model_id=GGUF_8B.model_id), "f16"),
        (GGUF_8B, PlacementRequest(model_id=GGUF_8B.model_id, default_kv_cache_type="q8_0"), "q8_0"),  # the node's
        (card, PlacementRequest(model_id=card.model_id, default_kv_cache_type="q8_0"), "q4_0"),  # the card's
        (card, PlacementRequest(model_id=card.model_id, kv_cache_type="q8_0"), "q8_0"),  # the placement's
    ]
    for which, request, expected in cases:
        instance = place(which, STATE, {"a": GPU_12GB}, request, new_id=ids())
        assert [s.kv_cache_type for s in instance.shards] == [expected], (request, expected)
        assert placement_intent(instance, STATE).kv_cache_type == expected


@pytest.mark.parametrize(("backend", "kv_type", "flash_attn", "head_dims", "says"), [
    ("llama_cpp-cuda", "q8_0", None, (128, 128), None),
    ("llama_server-cpu", "q4_0", None, (128, 128), None),
    ("llama_cpp-cpu", "q8_0", False, (128, 128), "flash attention"),
    ("llama_cpp-cpu", "f16", False, (128, 128), None),
    ("llama_cpp-cpu", "q8_0", None, (80, 80), None),  # ggml's blocks run along whole rows
    ("mlx-metal", "q8_0", None, (128, 128), None),
    ("mlx-cpu", "q4_0", None, (32, 32), None),
    ("mlx-metal", "q8_0", False, (64, 64), None),  # MLX has no flash-attention switch to pin
    ("mlx-metal", "q8_0", None, (80, 80), "groups of 64 or 32 elements per head"),
    ("mlx-metal", "f16", None, (80, 80), None),
    ("vllm-cuda", "q4_0", None, (128, 128), "the vllm engine serves KV cache types f16, not q4_0"),
])
def test_kv_cache_type_refusal(backend, kv_type, flash_attn, head_dims, says):
    found = kv_cache_type_refusal(backend, kv_type, flash_attn, head_dims)
    assert (found is None) == (says is None) and (says is None or says in found)


def test_a_type_no_engine_of_the_card_holds_is_refused_by_name():
    odd_heads = LLAMA_1B.model_copy(update={"head_dim": 80})
    with pytest.raises(KvCacheTypeUnsupported, match="MLX quantizes the KV cache in groups of 64 or 32"):
        place(odd_heads, STATE, {"a": res("a", 60 * GB, MLX_CPU)},
              PlacementRequest(model_id=odd_heads.model_id, kv_cache_type="q8_0"), new_id=ids())
    pinned = GGUF_8B.model_copy(update={"runtime": GGUF_8B.runtime.model_copy(update={"flash_attn": False})})
    with pytest.raises(KvCacheTypeUnsupported, match="flash attention") as caught:
        preview(pinned, STATE, {"a": GPU_12GB}, kv_cache_type="q4_0")
    assert caught.value.code == "kv_cache_type_unsupported"


@pytest.mark.parametrize(("value", "parsed"), [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("default", "f16")])
def test_names_and_the_old_default(value, parsed):
    assert parse_kv_cache_type(value) == parsed
    assert chosen_kv_cache_type(None, None, value) == parsed


def test_old_and_unknown_names_are_refused_with_the_names_to_use(tmp_path):
    with pytest.raises(ValueError, match=r"use one of f16, q8_0, q4_0 .*mlx_quantized was never served"):
        parse_kv_cache_type("mlx_quantized")
    with pytest.raises(ConfigError, match=r"kv_cache_backend.*'turboquant' is not a KV cache type"):
        parse_config("kv_cache_backend: turboquant\n", tmp_path / "skulk.yaml")
    assert parse_config("kv_cache_backend: q8_0\n", tmp_path / "skulk.yaml").kv_cache_backend == "q8_0"
    assert set(KV_ELEMENT_BYTES) == {"f16", "q8_0", "q4_0"}
