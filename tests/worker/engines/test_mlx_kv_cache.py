"""The MLX engine's quantized KV cache (`mlx.kv_quant`) on the generated tiny Llama: a shard
stamped q8_0 or q4_0 decodes on mlx-lm's `QuantizedKVCache` of that many bits, on one rank
(one request at a time: mlx-lm cannot batch it), through the prefix cache (hot and cold), and
in pipeline and tensor groups, which decode exactly what one quantized rank does. The bytes
the planner counts per element are mlx's own layout's, measured on real arrays.

Measured on this model: q8_0's greedy tokens equal f16's (its logits' margins exceed the
error); q4_0's part from them within a few tokens, which is what lets a group test tell a
rank that quantized from one that did not."""

from __future__ import annotations

import threading
from fractions import Fraction
from pathlib import Path
from typing import cast

import pytest

from skulk.shared.prefix_cache import COLD_BUDGET_ENV
from skulk.shared.types.kv_cache import (
    KV_ELEMENT_BYTES,
    KvCacheType,
    kv_element_bytes,
    mlx_kv_element_bytes,
    mlx_kv_group_size,
)
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import ModelLoadFailed
from skulk.worker.engines.mlx.batch import BATCH_WIDTH_ENV, DEFAULT_BATCH_WIDTH
from skulk.worker.engines.mlx.engine import MlxEngine
from skulk.worker.engines.mlx.kv_quant import KvQuantization, kv_quantization, quantized_cache
from tests.worker.engines.mlx_ranks import local_instance, run_group
from tests.worker.engines.test_mlx_engine import CARD, MODEL, spec_for, tiny_hf  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(300)

LONG_PROMPT = " ".join(["It rained again on Thursday and the cluster by the sea kept every node awake."] * 24)
"""A few hundred tokens: enough cached positions for quantization error to reach the logits."""
DECODE_TOKENS = 32


def greedy(prompt: str, max_tokens: int = DECODE_TOKENS) -> TextGenerationParams:
    return TextGenerationParams(model_id=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0)


def load(path: Path, kv_type: KvCacheType, budget_mb: str = "64", width: int = 1) -> MlxEngine:
    """A single rank; unbatched unless `width` says otherwise (its hot cache is inspected)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(COLD_BUDGET_ENV, budget_mb)
        patch.setenv(BATCH_WIDTH_ENV, str(width))
        engine = MlxEngine()
        engine.load(spec_for(local_instance(CARD, 1, kv_cache_type=kv_type), path))
    engine.warm_up()
    return engine


def token_ids(engine: MlxEngine, request: TextGenerationParams) -> list[int]:
    return [t.token_id for t in engine.generate(request, threading.Event()) if t.token_id is not None]


# ---------------------------------------------------------------------------------------
# The arithmetic (pure, and against mlx's real arrays)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("head_dims", "group"), [
    ((128, 128), 64), ((64, 64), 64), ((256, 256), 64), ((192, 128), 64), ((32, 32), 32), ((96, 96), 32),
    ((576, 0), 64),  # a keys-only latent cache: the empty value width is skipped
    ((80, 80), None), ((128, 80), None),
])
def test_group_size_follows_the_head_widths(head_dims, group) -> None:
    assert mlx_kv_group_size(head_dims) == group


@pytest.mark.parametrize(("kv_type", "head_dims", "expected"), [
    ("f16", (128, 128), Fraction(2)),
    ("q8_0", (128, 128), Fraction(34, 32)),  # MLX at group 64 == ggml's block_q8_0
    ("q4_0", (128, 128), Fraction(18, 32)),  # == block_q4_0
    ("q8_0", (32, 32), Fraction(36, 32)),  # MLX at group 32 costs more than ggml: counted
    ("q4_0", (32, 32), Fraction(20, 32)),
    ("q8_0", (80, 80), Fraction(34, 32)),  # MLX cannot serve it (refused): ggml's
])
def test_the_planner_counts_the_larger_engine_layout(kv_type, head_dims, expected) -> None:
    assert kv_element_bytes(kv_type, head_dims) == expected


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
@pytest.mark.parametrize("head_dim", [128, 64, 32])
def test_mlx_element_bytes_are_its_real_layouts(kv_type, head_dim) -> None:
    """Fill mlx-lm's own QuantizedKVCache with f16 keys and values and weigh it: packed values,
    scales and biases together are exactly what `mlx_kv_element_bytes` says."""
    import mlx.core as mx
    from mlx_lm.models.cache import QuantizedKVCache

    quantization = kv_quantization(kv_type, (head_dim, head_dim))
    assert quantization is not None
    heads, tokens = 2, 256  # a whole allocation step: no padding positions
    cache = QuantizedKVCache(group_size=quantization.group_size, bits=quantization.bits)
    kv = mx.random.normal((1, heads, tokens, head_dim)).astype(mx.float16)
    cache.update_and_fetch(kv, kv)
    mx.eval(cache.keys, cache.values)
    elements = 2 * heads * tokens * head_dim
    measured = Fraction(cast(int, cache.nbytes), elements)
    assert measured == mlx_kv_element_bytes(kv_type, quantization.group_size)
    if quantization.group_size == 64:
        assert measured == KV_ELEMENT_BYTES[kv_type]


@pytest.mark.parametrize(("kv_type", "head_dims", "expected"), [
    ("f16", (32, 32), None),
    ("q8_0", (128, 128), KvQuantization("q8_0", 8, 64)),
    ("q4_0", (32, 32), KvQuantization("q4_0", 4, 32)),
])
def test_kv_quantization(kv_type, head_dims, expected) -> None:
    assert kv_quantization(kv_type, head_dims) == expected


def test_a_head_width_no_group_divides_fails_the_load_by_name() -> None:
    with pytest.raises(ModelLoadFailed, match="no group size divides its head widths 80, 80"):
        kv_quantization("q8_0", (80, 80))


def test_only_plain_cache_layers_are_quantized_and_others_fail_by_name() -> None:
    from mlx_lm.models.cache import KVCache, QuantizedKVCache, RotatingKVCache

    quantization = KvQuantization("q4_0", 4, 64)
    assert quantized_cache([KVCache()], None)[0].__class__ is KVCache
    (layer,) = quantized_cache([KVCache()], quantization)
    assert isinstance(layer, QuantizedKVCache) and (layer.bits, layer.group_size) == (4, 64)
    with pytest.raises(ModelLoadFailed, match=r"RotatingKVCache layers.*place it with an f16 KV cache"):
        quantized_cache([KVCache(), RotatingKVCache(max_size=16)], quantization)


# ---------------------------------------------------------------------------------------
# One rank
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain(tiny_hf):
    engine = load(tiny_hf, "f16")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def q8(tiny_hf):
    engine = load(tiny_hf, "q8_0")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def q4(tiny_hf):
    engine = load(tiny_hf, "q4_0")
    yield engine
    engine.close()


@pytest.mark.parametrize(("kv_type", "bits"), [("q8_0", 8), ("q4_0", 4)])
def test_the_placed_type_reaches_the_engines_cache(tiny_hf, kv_type, bits) -> None:
    from mlx_lm.models.cache import QuantizedKVCache

    engine = load(tiny_hf, kv_type)
    try:
        out = token_ids(engine, greedy("The cluster by the sea"))
        assert len(out) == DECODE_TOKENS
        assert engine.prefixes is not None
        hot = engine.prefixes.hot
        assert len(hot) == CARD.num_layers
        # The tiny model's heads are 32 wide: grouped by 32.
        assert all(isinstance(c, QuantizedKVCache) and c.bits == bits and c.group_size == 32 for c in hot)
        assert all(c.offset > 0 for c in hot)
    finally:
        engine.close()


def test_q8_0_holds_values_close_to_f16s_and_decodes_the_long_prompt(plain, q8) -> None:
    """On a long prompt the q8_0 cache's dequantized keys differ from the f16 cache's (it is
    really quantized) by less than one quantization step of their range; the greedy tokens of
    this tiny model come out the same (measured: its logits' margins exceed the error)."""
    import mlx.core as mx

    request = greedy(LONG_PROMPT)
    f16_tokens, q8_tokens = token_ids(plain, request), token_ids(q8, request)
    assert len(q8_tokens) == len(f16_tokens) == DECODE_TOKENS
    assert plain.prefixes is not None and q8.prefixes is not None
    exact, packed = plain.prefixes.hot[0], q8.prefixes.hot[0]
    held = min(exact.offset, packed.offset)
    assert held > 300
    keys = exact.keys[..., :held, :]
    restored = mx.dequantize(*(p[..., :held, :] for p in packed.keys), group_size=packed.group_size, bits=8)
    error = cast(float, mx.max(mx.abs(restored - keys)).item())
    step = cast(float, (mx.max(keys) - mx.min(keys)).item()) / 255
    assert 0 < error <= step
    assert q8_tokens == f16_tokens


def test_q4_0_decodes_but_parts_from_f16(plain, q4) -> None:
    request = greedy("The cluster by the sea")
    f16_tokens, q4_tokens = token_ids(plain, request), token_ids(q4, request)
    assert len(q4_tokens) == DECODE_TOKENS and q4_tokens != f16_tokens


def test_prefix_reuse_on_a_quantized_cache_matches_fresh_requests(tiny_hf, q8) -> None:
    """Hot reuse (a follow-up extending the last prompt) and a cold restore (a conversation
    come back after another) decode what an engine with no cache history does."""
    first, other = "The cluster by the sea woke up and", "What is a node in a cluster of machines?"
    fresh = load(tiny_hf, "q8_0", budget_mb="0")
    try:
        expected = {p: token_ids(fresh, greedy(p, 12)) for p in (first, first + " then", other)}
    finally:
        fresh.close()
    assert q8.prefixes is not None
    stats = q8.prefixes.stats
    hot_before, cold_before = stats.hot_hit_tokens, stats.cold_hit_tokens
    assert token_ids(q8, greedy(first, 12)) == expected[first]
    assert token_ids(q8, greedy(first + " then", 12)) == expected[first + " then"]
    assert stats.hot_hit_tokens > hot_before
    assert token_ids(q8, greedy(other, 12)) == expected[other]
    assert token_ids(q8, greedy(first, 12)) == expected[first]  # from the cold store
    assert stats.cold_hit_tokens > cold_before


# ---------------------------------------------------------------------------------------
# One rank, batched (the default width)
# ---------------------------------------------------------------------------------------


def test_a_batch_decodes_on_quantized_caches_what_one_request_at_a_time_does(tiny_hf, q4) -> None:
    """Concurrent requests share q4_0 decode steps (skulk's batch cache for mlx-lm's quantized
    layout) and each gets the tokens the unbatched q4_0 rank gives it alone; what the batch
    keeps for prefix reuse is the quantized size, and a follow-up starts from it."""
    prompts = ["The cluster by the sea", "What is a node?", LONG_PROMPT, "It rained again on Thursday and the"]
    expected = {p: token_ids(q4, greedy(p)) for p in prompts}
    batched = load(tiny_hf, "q4_0", width=DEFAULT_BATCH_WIDTH)
    plain_batched = load(tiny_hf, "f16", width=DEFAULT_BATCH_WIDTH)
    try:
        assert batched.concurrency == DEFAULT_BATCH_WIDTH
        got: dict[str, list[int]] = {}
        threads = [threading.Thread(target=lambda p=p: got.__setitem__(p, token_ids(batched, greedy(p))))
                   for p in prompts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert got == expected
        # The same sequences kept by an f16 batch: the tiny model's activations are float32,
        # so f16's plain cache holds 4 bytes an element and q4_0 at group 32 holds
        # 4/8 + 2 * 4/32 = 0.75: 3/16 of it.
        for p in prompts:
            token_ids(plain_batched, greedy(p))
        assert batched.prefixes is not None and plain_batched.prefixes is not None
        kept, plain_kept = batched.prefixes.stats.cold_bytes, plain_batched.prefixes.stats.cold_bytes
        assert kept > 0 and Fraction(kept, plain_kept) == Fraction(3, 16), (kept, plain_kept)
        # Sequences of different lengths join a batch already decoding and leave it at
        # different steps (the batch cache's extend and filter on the quantized triples).
        first_token = threading.Event()
        long_request = greedy("The cluster by the sea", 64)

        def decode_long() -> None:
            out = []
            for token in batched.generate(long_request, threading.Event()):
                if token.token_id is not None:
                    out.append(token.token_id)
                    first_token.set()
            got["long"] = out

        leader = threading.Thread(target=decode_long)
        leader.start()
        assert first_token.wait(60)
        joiners = [threading.Thread(target=lambda p=p, n=n: got.__setitem__(p, token_ids(batched, greedy(p, n))))
                   for p, n in zip(prompts[1:], (5, 40, 17), strict=True)]
        for thread in joiners:
            thread.start()
        for thread in [leader, *joiners]:
            thread.join(120)
        assert got["long"] == token_ids(q4, long_request)
        for p, n in zip(prompts[1:], (5, 40, 17), strict=True):
            assert got[p] == token_ids(q4, greedy(p, n)), p
        follow_up = LONG_PROMPT + " And then"
        hits = batched.prefixes.stats.cold_hit_tokens
        assert token_ids(batched, greedy(follow_up)) == token_ids(q4, greedy(follow_up))
        assert batched.prefixes.stats.cold_hit_tokens > hits
    finally:
        batched.close()
        plain_batched.close()


# ---------------------------------------------------------------------------------------
# Groups of real rank processes on loopback
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sharding", "world"), [("Pipeline", 2), ("Tensor", 2)])
def test_a_group_decodes_on_quantized_caches_exactly_what_one_quantized_rank_does(tiny_hf, plain, q4, sharding,
                                                                                   world) -> None:
    """q4_0, whose tokens part from f16's: a rank that ignored the type would show."""
    requests = [greedy("The cluster by the sea"), greedy(LONG_PROMPT, 16)]
    expected = [token_ids(q4, r) for r in requests]
    assert expected[0] != token_ids(plain, requests[0])
    reports = run_group(local_instance(CARD, world, sharding, kv_cache_type="q4_0"), CARD, tiny_hf, requests,
                        timeout_s=150)
    for report in reports:
        assert report.ok, f"rank {report.rank}: {report.error}"
    assert reports[0].tokens == expected


# ---------------------------------------------------------------------------------------
# Prompt-lookup speculation on a quantized cache
# ---------------------------------------------------------------------------------------

REPEATING = "one two three four one two three four one two three four one two"


def test_speculation_drafts_on_a_quantized_cache_and_keeps_its_tokens(tiny_hf, q4) -> None:
    """Rejected drafts are trimmed from the quantized cache as from the plain one: the
    greedy tokens are those of the same q4_0 rank stepping one token at a time."""
    from skulk.worker.engines.base import ShardSpec

    card = CARD.model_copy(update={"runtime": CARD.runtime.model_copy(update={"speculative": "ngram"})})
    instance = local_instance(card, 1, kv_cache_type="q4_0")
    engine = MlxEngine()
    engine.load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=card, model_path=str(tiny_hf)))
    engine.warm_up()
    try:
        request = greedy(REPEATING, 120)
        tokens = list(engine.generate(request, threading.Event()))
        usage = tokens[-1].usage
        assert usage is not None and usage.drafted_tokens > 0 and usage.accepted_draft_tokens > 0, usage
        assert [t.token_id for t in tokens if t.token_id is not None] == token_ids(q4, request)
    finally:
        engine.close()
