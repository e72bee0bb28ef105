import math
from fractions import Fraction

import pytest

from skulk.models.cards import builtin_cards_dir, resolve_cards
from skulk.shared.memory_estimate import (
    ADMISSION_CONTEXT_FLOOR_TOKENS,
    FLAT_FLOOR_BYTES,
    VLLM_CONTEXT_CAP_TOKENS,
    NodeMemoryTotals,
    admission_context_tokens,
    assignment_footprint,
    instance_context_token_limit,
    instance_node_footprints,
    kv_bytes_per_token,
    kv_cache_bytes,
    projector_bytes,
    shard_footprint,
    shard_footprint_bytes,
)
from skulk.shared.types.instances import Instance, ShardAssignment

CARDS = resolve_cards(builtin_cards_dir(), None).cards
TINY = CARDS["local/tiny-llama"]
LLAMA_1B = CARDS["mlx-community/Llama-3.2-1B-Instruct-4bit"]
GEMMA3 = CARDS["mlx-community/gemma-3-4b-it-4bit"]
GGUF_8B = CARDS["bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"]
GB = 10**9


def shard(node, start, end, backend="mlx-cpu", rank=0, world=1):
    return ShardAssignment(
        node_id=node, runner_id=f"r{rank}", rank=rank, world_size=world, start_layer=start, end_layer=end, backend=backend
    )


@pytest.mark.parametrize(
    ("card", "expected", "q8_0_per_32", "q4_0_per_32"),
    [
        # 32-wide heads: MLX groups them by 32 (4 bytes of scale and bias per 32 elements),
        # more than ggml's 34 and 18 per block of 32, and the planner counts the larger.
        (TINY, 2 * 6 * 2 * 32 * 2, 36, 20),
        (LLAMA_1B, 2 * 16 * 8 * 64 * 2, 34, 18),
        (GEMMA3, 2 * 34 * 4 * 256 * 2, 34, 18),
        # values wider than keys (MLA-style): each layer holds kv_heads x (k + v) dims
        (TINY.model_copy(update={"value_head_dim": 64}), 6 * 2 * (32 + 64) * 2, 36, 20),
    ],
)
def test_kv_bytes_per_token(card, expected, q8_0_per_32, q4_0_per_32):
    assert kv_bytes_per_token(card) == expected
    # A quantized cache: 34 bytes per block of 32 elements (q8_0), 18 (q4_0), on llama.cpp
    # and on MLX grouping 64-wide heads by 64.
    assert kv_bytes_per_token(card, "q8_0") == expected // 2 * q8_0_per_32 // 32
    assert kv_bytes_per_token(card, "q4_0") == expected // 2 * q4_0_per_32 // 32
    assert kv_bytes_per_token(card, layers=range(2)) == expected * 2 // card.num_layers


# Gemma 3: pattern 6 -> layers 5, 11, 17, 23, 29 global (5), the other 29 windowed to 1024.
GEMMA_LAYER = 2 * 4 * 256 * 2


@pytest.mark.parametrize(
    ("card", "tokens", "layers", "expected"),
    [
        (LLAMA_1B, 8192, None, 16 * 2048 * 8192),
        (LLAMA_1B, 8192, range(4, 8), 4 * 2048 * 8192),
        (GEMMA3, 512, None, 34 * GEMMA_LAYER * 512),  # within the window every layer grows
        (GEMMA3, 8192, None, 5 * GEMMA_LAYER * 8192 + 29 * GEMMA_LAYER * 1024),
        (GEMMA3, 8192, range(0, 5), 5 * GEMMA_LAYER * 1024),  # all windowed
        (GEMMA3, 8192, range(5, 6), GEMMA_LAYER * 8192),  # the one global layer
    ],
)
def test_kv_cache_caps_windowed_layers_at_the_window(card, tokens, layers, expected):
    assert kv_cache_bytes(card, tokens, layers) == expected


def test_every_layer_windowed_without_a_pattern():
    card = LLAMA_1B.model_copy(update={"sliding_window": 100})
    assert kv_cache_bytes(card, 8192) == 16 * 2048 * 100


@pytest.mark.parametrize(("card", "tokens"), [(TINY, 2048), (LLAMA_1B, ADMISSION_CONTEXT_FLOOR_TOKENS)])
def test_admission_context_is_the_floor_or_the_cards_smaller_context(card, tokens):
    assert admission_context_tokens(card) == tokens


def test_pipeline_footprint_arithmetic():
    fp = shard_footprint(LLAMA_1B, range(0, 4), 8192)
    weights = math.ceil(695_000_000 * Fraction(4, 16))
    assert fp.weights_bytes == weights
    assert fp.kv_bytes == 4 * 2048 * 8192
    assert fp.total_bytes == math.ceil(weights * Fraction(115, 100)) + 4 * 2048 * 8192 + FLAT_FLOOR_BYTES
    assert shard_footprint_bytes(LLAMA_1B, range(0, 4), 8192) == fp.total_bytes
    assert fp.describe() == "weights 0.17 GB x 1.15 + KV 0.07 GB (8192 tokens) + floor 0.54 GB = 0.80 GB"


def test_tensor_footprint_splits_weights_and_kv_evenly():
    half = shard_footprint(LLAMA_1B, Fraction(1, 2), 8192)
    whole = shard_footprint(LLAMA_1B, range(16), 8192)
    assert half.weights_bytes == whole.weights_bytes // 2
    assert half.kv_bytes == whole.kv_bytes // 2


@pytest.mark.parametrize(
    ("share", "error"),
    [(range(0, 17), ValueError), (range(3, 3), ValueError), (0, ValueError), (17, ValueError),
     (Fraction(0), ValueError), (Fraction(3, 2), ValueError), (0.5, TypeError)],
)
def test_footprint_rejects_out_of_range_shares(share, error):
    with pytest.raises(error):
        shard_footprint(LLAMA_1B, share, 8192)


def test_default_context_is_the_admission_context():
    assert shard_footprint(LLAMA_1B, range(16)) == shard_footprint(LLAMA_1B, range(16), 8192)
    assert shard_footprint(TINY, range(6)).context_tokens == 2048


@pytest.mark.parametrize(
    ("card", "count", "exact_layers"),
    [
        (LLAMA_1B, 4, range(0, 4)),  # no window: a count is as good as a range
        (GEMMA3, 5, range(0, 5)),  # five windowed layers...
    ],
)
def test_a_layer_count_bounds_kv_from_above(card, count, exact_layers):
    by_count = shard_footprint(card, count, 8192)
    exact = shard_footprint(card, exact_layers, 8192)
    assert by_count.weights_bytes == exact.weights_bytes
    assert by_count.kv_bytes >= exact.kv_bytes
    if card.sliding_window is None:
        assert by_count == exact
    else:  # ...are counted as the five global ones
        assert by_count.kv_bytes == 5 * GEMMA_LAYER * 8192


def _fixed(card, layers):
    fp = shard_footprint(card, layers, 0)
    return fp.weights_with_overhead_bytes + fp.floor_bytes


LLAMA_1B_RATE = 16 * 2048
SMALL_RAM = 2 * GB


@pytest.mark.parametrize(
    ("name", "card", "shards", "totals", "expected"),
    [
        ("mlx, ample RAM: the card's whole context", LLAMA_1B, [shard("a", 0, 16)], {"a": NodeMemoryTotals(64 * GB)}, 131072),
        (
            "mlx, tight RAM: tokens whose KV fits after weights and floor",
            LLAMA_1B,
            [shard("a", 0, 16)],
            {"a": NodeMemoryTotals(SMALL_RAM)},
            (SMALL_RAM - _fixed(LLAMA_1B, range(16))) // LLAMA_1B_RATE,
        ),
        ("never below the floor", LLAMA_1B, [shard("a", 0, 16)], {"a": NodeMemoryTotals(GB)}, 8192),
        ("a context smaller than the floor is the whole answer", TINY, [shard("a", 0, 6)], {"a": NodeMemoryTotals(GB)}, 2048),
        ("uncomputable (no totals): the floor", LLAMA_1B, [shard("a", 0, 16)], {}, 8192),
        (
            "the minimum over nodes",
            LLAMA_1B,
            [shard("a", 0, 8, rank=0, world=2), shard("b", 8, 16, rank=1, world=2)],
            {"a": NodeMemoryTotals(64 * GB), "b": NodeMemoryTotals(SMALL_RAM)},
            (SMALL_RAM - _fixed(LLAMA_1B, range(8, 16))) // (8 * 2048),
        ),
        (
            "gguf on cpu keeps the floor however much RAM",
            GGUF_8B,
            [shard("a", 0, 32, "llama_cpp-cpu")],
            {"a": NodeMemoryTotals(512 * GB)},
            8192,
        ),
        (
            "gguf on a gpu without a discrete VRAM total keeps the floor",
            GGUF_8B,
            [shard("a", 0, 32, "llama_cpp-vulkan")],
            {"a": NodeMemoryTotals(512 * GB)},
            8192,
        ),
        (
            "gguf on discrete VRAM is lifted to what fits the VRAM",
            GGUF_8B,
            [shard("a", 0, 32, "llama_cpp-cuda")],
            {"a": NodeMemoryTotals(512 * GB, discrete_vram_bytes=16 * GB)},
            (16 * GB - _fixed(GGUF_8B, range(32))) // (32 * 4096),
        ),
        (
            "vllm is capped",
            GGUF_8B,
            [shard("a", 0, 32, "vllm-cuda")],
            {"a": NodeMemoryTotals(512 * GB, discrete_vram_bytes=141 * GB)},
            VLLM_CONTEXT_CAP_TOKENS,
        ),
    ],
)
def test_instance_context_token_limit(name, card, shards, totals, expected):
    assert instance_context_token_limit(card, shards, totals) == expected


def test_windowed_layers_stop_growing_past_the_window():
    totals = {"a": NodeMemoryTotals(5 * GB)}
    budget = 5 * GB - _fixed(GEMMA3, range(34))
    expected = (budget - 29 * GEMMA_LAYER * 1024) // (5 * GEMMA_LAYER)
    assert 1024 < expected < GEMMA3.context_length
    assert instance_context_token_limit(GEMMA3, [shard("a", 0, 34)], totals) == expected
    # and the answer really is the most that fits
    assert kv_cache_bytes(GEMMA3, expected) <= budget < kv_cache_bytes(GEMMA3, expected + 1)


def test_tensor_ranks_hold_a_share_of_every_layer():
    shards = [shard("a", 0, 16, rank=0, world=2), shard("b", 0, 16, rank=1, world=2)]
    totals = {"a": NodeMemoryTotals(SMALL_RAM), "b": NodeMemoryTotals(SMALL_RAM)}
    fixed = shard_footprint(LLAMA_1B, Fraction(1, 2), 0)
    budget = SMALL_RAM - fixed.weights_with_overhead_bytes - fixed.floor_bytes
    assert instance_context_token_limit(LLAMA_1B, shards, totals) == budget // (LLAMA_1B_RATE // 2)


def test_deterministic_from_static_totals():
    shards = [shard("a", 0, 16)]
    totals = {"a": NodeMemoryTotals(SMALL_RAM)}
    assert len({instance_context_token_limit(LLAMA_1B, shards, totals) for _ in range(5)}) == 1


def test_instance_node_footprints_sum_per_node():
    instance = Instance(
        instance_id="i",
        model_id=LLAMA_1B.model_id,
        sharding="Pipeline",
        shards=[shard("a", 0, 6, rank=0, world=2), shard("b", 6, 16, rank=1, world=2)],
        context_token_limit=8192,
    )
    assert instance_node_footprints(LLAMA_1B, instance) == {
        "a": shard_footprint_bytes(LLAMA_1B, range(0, 6)),
        "b": shard_footprint_bytes(LLAMA_1B, range(6, 16)),
    }


# -- served-engine slots ----------------------------------------------------------------------


def test_a_footprint_holds_kv_for_every_copy():
    one = shard_footprint(GGUF_8B, range(GGUF_8B.num_layers), 8192)
    four = shard_footprint(GGUF_8B, range(GGUF_8B.num_layers), 8192, kv_copies=4)
    assert four.kv_bytes == 4 * one.kv_bytes and four.total_bytes == one.total_bytes + 3 * one.kv_bytes
    assert "(8192 tokens x 4 slots)" in four.describe() and "(8192 tokens)" in one.describe()
    with pytest.raises(ValueError):
        shard_footprint(GGUF_8B, range(GGUF_8B.num_layers), 8192, kv_copies=0)


@pytest.mark.parametrize(("backend", "slots", "divisor"), [
    ("llama_server-cuda", 4, 4),  # each slot's window: a quarter of what one would get
    ("llama_server-cuda", 1, 1),
    ("llama_cpp-cuda", 1, 1),
])
def test_a_vram_window_is_per_slot(backend, slots, divisor):
    card = GGUF_8B
    placed = shard("a", 0, card.num_layers, backend).model_copy(update={"slots": slots})
    vram = 40 * GB
    limit = instance_context_token_limit(card, [placed], {"a": NodeMemoryTotals(64 * GB, vram)})
    budget = vram - _fixed(card, range(card.num_layers))
    expected = min(card.context_length, budget // (kv_bytes_per_token(card) * divisor))
    assert limit == max(admission_context_tokens(card), expected)


def drafting(card, draft_bytes: int, method: str = "draft"):
    """`card` speculating with a draft of `draft_bytes` (validated: the fields go together)."""
    data = card.model_dump(by_alias=False)
    data.update(served_spec_draft_repo="acme/draft-GGUF", served_spec_draft_file="d.gguf",
                served_spec_draft_size_bytes=draft_bytes, runtime={"speculative": method})
    return type(card).model_validate(data)


@pytest.mark.parametrize(("method", "draft_share"), [("draft", Fraction(1, 10)), ("ngram", Fraction(0))])
def test_a_draft_model_is_admitted_with_the_target(method, draft_share):
    card = drafting(GGUF_8B, GGUF_8B.storage_size_bytes // 10, method)
    plain = shard_footprint(GGUF_8B, range(GGUF_8B.num_layers), 8192, kv_copies=2)
    with_draft = shard_footprint(card, range(card.num_layers), 8192, kv_copies=2)
    expected = math.ceil((plain.weights_with_overhead_bytes + plain.kv_bytes) * draft_share)
    assert with_draft.draft_bytes == expected
    assert with_draft.total_bytes == plain.total_bytes + expected
    assert ("+ draft" in with_draft.describe()) == (method == "draft")


def test_a_draft_model_narrows_the_window_it_shares():
    card = drafting(GGUF_8B, GGUF_8B.storage_size_bytes // 10)
    placed = shard("a", 0, card.num_layers, "llama_server-cuda").model_copy(update={"slots": 1})
    totals = {"a": NodeMemoryTotals(64 * GB, 12 * GB)}
    plain = instance_context_token_limit(GGUF_8B, [placed], totals)
    narrowed = instance_context_token_limit(card, [placed], totals)
    assert admission_context_tokens(card) < narrowed < plain
    # What is left after the target's and the draft's fixed costs, at their two KV rates.
    fixed = shard_footprint(card, range(card.num_layers), 0)
    budget = 12 * GB - (fixed.weights_with_overhead_bytes + fixed.floor_bytes + fixed.draft_bytes)
    assert narrowed == min(card.context_length, math.floor(budget / (kv_bytes_per_token(card) * Fraction(11, 10))))


PROJECTOR_BYTES = 800_000_000  # Gemma 3 4B's mmproj at f16


def seeing(card, size_bytes=PROJECTOR_BYTES):
    """`card` as a vision GGUF card whose mmproj ships in its own repo."""
    data = card.model_dump()
    data.update(capabilities=[*card.capabilities, "vision"], vision_weights_repo=card.model_id,
                vision_weights_file="mmproj-f16.gguf", vision_weights_size_bytes=size_bytes)
    return type(card).model_validate(data)


@pytest.mark.parametrize(("share", "loads_projector", "projector"), [
    (range(0, 32), None, PROJECTOR_BYTES),        # the single node / a pipeline's first stage
    (range(0, 16), None, PROJECTOR_BYTES),
    (range(16, 32), None, 0),                     # a later stage never loads it
    (16, None, PROJECTOR_BYTES),                  # position unknown: bounded from above
    (Fraction(1, 2), None, PROJECTOR_BYTES),
    (Fraction(1, 2), False, 0),                   # a tensor rank other than 0
    (range(0, 16), False, 0),
])
def test_a_projector_is_admitted_on_the_rank_that_loads_it(share, loads_projector, projector):
    card = seeing(GGUF_8B)
    plain = shard_footprint(GGUF_8B, share, 8192)
    with_projector = shard_footprint(card, share, 8192, loads_projector=loads_projector)
    assert with_projector.projector_bytes == projector
    assert with_projector.total_bytes == plain.total_bytes + projector
    assert ("+ projector 0.80 GB" in with_projector.describe()) == (projector > 0)


@pytest.mark.parametrize(("rank", "start", "end", "projector"), [
    (0, 0, 16, PROJECTOR_BYTES), (1, 16, 32, 0),
])
def test_a_placed_shard_counts_the_projector_on_rank_0_only(rank, start, end, projector):
    card = seeing(GGUF_8B)
    placed = shard(f"n{rank}", start, end, "llama_cpp-cpu", rank=rank, world=2)
    assert assignment_footprint(card, placed).projector_bytes == projector
    pipeline = Instance(instance_id="i", model_id=card.model_id, sharding="Pipeline", context_token_limit=8192,
                        shards=[shard("n0", 0, 16, "llama_cpp-cpu", 0, 2), shard("n1", 16, 32, "llama_cpp-cpu", 1, 2)])
    footprints = instance_node_footprints(card, pipeline)
    plain = instance_node_footprints(GGUF_8B, pipeline)
    assert footprints == {"n0": plain["n0"] + PROJECTOR_BYTES, "n1": plain["n1"]}


@pytest.mark.parametrize(("card", "expected"), [
    (GGUF_8B, 0),                                           # no vision
    (seeing(GGUF_8B), PROJECTOR_BYTES),
    (seeing(GGUF_8B, None), 0),                             # a card logged before the size existed
    (CARDS["local/tiny-vlm-gguf"], 425_000),                # the generated mmproj.gguf beside the model
    (GEMMA3, 0),                                            # MLX: the vision tower is in the repo's weights
])
def test_projector_bytes(card, expected):
    assert projector_bytes(card) == expected


def test_a_projector_narrows_the_window_like_any_fixed_cost():
    card = seeing(GGUF_8B)
    placed = shard("a", 0, card.num_layers, "llama_server-cuda").model_copy(update={"slots": 1})
    totals = {"a": NodeMemoryTotals(64 * GB, 12 * GB)}
    plain = instance_context_token_limit(GGUF_8B, [placed], totals)
    narrowed = instance_context_token_limit(card, [placed], totals)
    assert admission_context_tokens(card) < narrowed < plain
    fixed = shard_footprint(card, range(card.num_layers), 0)
    budget = 12 * GB - (fixed.weights_with_overhead_bytes + fixed.floor_bytes + PROJECTOR_BYTES)
    assert narrowed == min(card.context_length, math.floor(budget / kv_bytes_per_token(card)))


def test_a_projector_size_needs_a_projector():
    data = GGUF_8B.model_dump()
    data.update(vision_weights_size_bytes=1000)
    with pytest.raises(ValueError, match="set without a projector"):
        type(GGUF_8B).model_validate(data)
