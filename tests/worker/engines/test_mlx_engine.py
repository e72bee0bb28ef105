"""The MLX engine on the generated tiny Llama: one rank in-process (batched, as by default, and
unbatched), and pipeline and tensor groups of real rank processes on loopback, all decoding
exactly the tokens one rank does.

The reference is mlx-lm's own `generate_step` on the unsharded model, which
tests/models/test_tiny_models.py holds equal to llama.cpp's greedy tokens."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.ids import InstanceId, ModelId, NodeId, RunnerId
from skulk.shared.types.instances import Instance, ShardAssignment
from skulk.shared.types.tasks import ResponseFormat, TextGenerationParams
from skulk.worker.engines.base import EngineNotLoaded, GeneratedToken, ModelLoadFailed, PromptTooLong, ShardSpec
from skulk.worker.engines.mlx.batch import (
    BATCH_WIDTH_ENV,
    DEFAULT_BATCH_WIDTH,
    MAX_BATCH_WIDTH,
    batch_width,
    batchable,
)
from skulk.worker.engines.mlx.engine import MlxEngine
from skulk.worker.engines.mlx.group import (
    GROUP_CONNECT_DEADLINE_ENV,
    LOOPBACK_HOST,
    MAX_RING_WORLD,
    OP_BEGIN,
    OP_STEP,
    EvalWatchdog,
    GroupFormationFailed,
    Header,
    derived_port_block,
    hostfile_json,
    ring_addresses,
    seconds_from_env,
)
from skulk.worker.engines.mlx.pipeline import StageRole, check_layer_range, stage_role
from skulk.worker.engines.mlx.sampling import DEFAULT_TEMPERATURE, resolve_sampling
from skulk.worker.engines.mlx.tensor import tensor_split_error
from skulk.worker.engines.mlx.text import byte_level_alphabet
from tests.worker.engines.mlx_ranks import local_instance, run_group, run_tensor_logits

pytestmark = pytest.mark.timeout(120)

CARD = load_card(builtin_cards_dir() / "local--tiny-llama.toml")
MODEL = ModelId(CARD.model_id)
PROMPTS = ("The cluster by the sea", "What is a node?", "It rained again on Thursday and the")
DECODE_TOKENS = 24


def params(prompt: str, **kwargs) -> TextGenerationParams:
    return TextGenerationParams(model_id=MODEL, prompt=prompt, **kwargs)


def greedy(prompt: str, max_tokens: int = DECODE_TOKENS) -> TextGenerationParams:
    return params(prompt, max_tokens=max_tokens, temperature=0)


GROUP_REQUESTS = [
    *(greedy(p) for p in PROMPTS),
    TextGenerationParams(
        model_id=MODEL, messages=[ChatMessage(role="user", content="Hello there")], max_tokens=12,
        temperature=0.9, top_p=0.9, seed=7,
    ),
]
"""What every group test decodes: greedy prompts plus one seeded, sampled chat request."""


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory) -> Path:
    from skulk.artifacts.resolve import ensure_local_model

    path = ensure_local_model(CARD, tmp_path_factory.mktemp("mlx-models"))
    assert (path / "config.json").is_file(), path
    return path


def spec_for(instance: Instance, model_path: Path, rank: int = 0) -> ShardSpec:
    return ShardSpec(instance=instance, runner_id=instance.shards[rank].runner_id, card=CARD, model_path=str(model_path))


@pytest.fixture(scope="module")
def engine(tiny_hf):
    """One rank as deployed: batched (the default width)."""
    engine = MlxEngine()
    engine.load(spec_for(local_instance(CARD, 1), tiny_hf))
    engine.warm_up()
    yield engine
    engine.close()


def unbatched_engine(path: Path) -> MlxEngine:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BATCH_WIDTH_ENV, "1")
        engine = MlxEngine()
        engine.load(spec_for(local_instance(CARD, 1), path))
    engine.warm_up()
    return engine


@pytest.fixture(scope="module")
def unbatched(tiny_hf):
    """One rank at width 1: the lockstep path groups run, on one rank."""
    engine = unbatched_engine(tiny_hf)
    yield engine
    engine.close()


@pytest.fixture(params=["batched", "unbatched"])
def one_rank(request) -> MlxEngine:
    """Each single-rank path in turn: whatever one honours, the other must too."""
    return request.getfixturevalue("engine" if request.param == "batched" else "unbatched")


@pytest.fixture(scope="module")
def reference(tiny_hf) -> dict[str, list[int]]:
    """mlx-lm's own greedy decode of the whole model, per prompt."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(tiny_hf))
    return {
        prompt: [int(t) for t, _ in generate_step(mx.array(tokenizer.encode(prompt)), model, max_tokens=DECODE_TOKENS)]
        for prompt in PROMPTS
    }


@pytest.fixture(scope="module")
def one_rank_tokens(engine) -> list[list[int]]:
    return [ids(run(engine, request)) for request in GROUP_REQUESTS]


def run(engine: MlxEngine, request: TextGenerationParams, cancelled: threading.Event | None = None) -> list[GeneratedToken]:
    return list(engine.generate(request, cancelled or threading.Event()))


def ids(tokens: list[GeneratedToken]) -> list[int]:
    return [t.token_id for t in tokens if t.token_id is not None]


# ---------------------------------------------------------------------------------------
# Pure decisions
# ---------------------------------------------------------------------------------------


def shard(rank: int, world: int, start: int = 0, end: int = 6, node: str = "n0") -> ShardAssignment:
    return ShardAssignment(node_id=NodeId(node), runner_id=RunnerId(f"r{rank}"), rank=rank, world_size=world,
                           start_layer=start, end_layer=end, backend="mlx-cpu")


def instance_of(nodes: list[str], ring_hosts: list[str] | None = None, instance_id: str = "i-1", hop: int = 0) -> Instance:
    world = len(nodes)
    return Instance(
        instance_id=InstanceId(instance_id), model_id=MODEL, sharding="Pipeline",
        shards=[shard(r, world, r, r + 1, node) for r, node in enumerate(nodes)],
        context_token_limit=64, ring_hosts=ring_hosts or [], repair_hop=hop,
    )


@pytest.mark.parametrize(
    ("nodes", "ring_hosts", "expected"),
    [
        (["a"], [], []),
        (["a", "b"], ["10.0.0.1:5000", "10.0.0.2:5001"], ["10.0.0.1:5000", "10.0.0.2:5001"]),
        (["a", "b"], ["10.0.0.1", "10.0.0.2"], ["10.0.0.1:{b}", "10.0.0.2:{b1}"]),
        (["a", "a", "a"], [], [f"{LOOPBACK_HOST}:{{b}}", f"{LOOPBACK_HOST}:{{b1}}", f"{LOOPBACK_HOST}:{{b2}}"]),
        (["a", "b"], ["[fe80::1]:7000", "[fe80::2]:7000"], ["fe80::1:7000", "fe80::2:7000"]),
    ],
)
def test_ring_addresses(nodes, ring_hosts, expected) -> None:
    instance = instance_of(nodes, ring_hosts)
    b = derived_port_block(instance)
    assert ring_addresses(instance) == [e.format(b=b, b1=b + 1, b2=b + 2) for e in expected]


@pytest.mark.parametrize(
    ("nodes", "ring_hosts", "match"),
    [
        (["a", "b"], [], "no ring_hosts"),
        (["a", "b"], ["10.0.0.1:5000"], "2 ranks"),
        (["a", "b"], ["10.0.0.1:5000", "10.0.0.1:5000"], "not distinct"),
    ],
)
def test_ring_addresses_refuse_what_cannot_form(nodes, ring_hosts, match) -> None:
    with pytest.raises(GroupFormationFailed, match=match):
        ring_addresses(instance_of(nodes, ring_hosts))


def test_every_placement_draws_a_fresh_port_block_every_rank_agrees_on() -> None:
    first = instance_of(["a", "a"], instance_id="i-1")
    assert derived_port_block(first) == derived_port_block(instance_of(["a", "a"], instance_id="i-1"))
    assert derived_port_block(first) != derived_port_block(instance_of(["a", "a"], instance_id="i-2"))
    assert derived_port_block(first) != derived_port_block(instance_of(["a", "a"], instance_id="i-1", hop=1))
    assert derived_port_block(first) % MAX_RING_WORLD == 0


def test_hostfile_is_one_address_list_per_rank() -> None:
    assert hostfile_json(["127.0.0.1:1", "127.0.0.1:2"]) == '[["127.0.0.1:1"], ["127.0.0.1:2"]]'


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, 5.0), ("", 5.0), ("2.5", 2.5), ("x", 5.0), ("-1", 5.0), ("0", 5.0)]
)
def test_seconds_from_env(raw, expected) -> None:
    name = "SKULK_PIPELINE_EVAL_TIMEOUT_SECONDS"
    env = {} if raw is None else {name: raw}
    assert seconds_from_env(env, name, 5.0) == expected


@pytest.mark.parametrize(
    "header",
    [
        Header(OP_BEGIN, seed=123456789, temperature=0.7, top_p=0.9, top_k=40),
        Header(OP_BEGIN, seed=5, temperature=1.0, top_p=1.0, top_k=0, min_p=0.25),
        Header(OP_STEP, n_tokens=512, sample=False, tokens_follow=True),
        Header(OP_STEP, n_tokens=1, sample=True),
    ],
)
def test_header_round_trips_exactly(header: Header) -> None:
    import struct

    decoded = Header.decode(header.encode())
    f32 = lambda v: struct.unpack("<f", struct.pack("<f", v))[0]  # noqa: E731
    assert decoded == Header(header.op, header.n_tokens, header.sample, header.tokens_follow, header.seed,
                             f32(header.temperature), f32(header.top_p), header.top_k, f32(header.min_p))


@pytest.mark.parametrize(
    ("rank", "world", "sharding", "start", "end", "role"),
    [
        (0, 1, "Pipeline", 0, 6, StageRole(0, 1, False, 0, 6)),
        (0, 2, "Pipeline", 0, 3, StageRole(0, 2, False, 0, 3)),
        (1, 2, "Pipeline", 3, 6, StageRole(1, 2, False, 3, 6)),
        (1, 2, "Tensor", 0, 6, StageRole(1, 2, True, 0, 6)),
    ],
)
def test_stage_role(rank, world, sharding, start, end, role) -> None:
    assert stage_role(shard(rank, world, start, end), sharding, 6) == role


def test_stage_duties() -> None:
    first, middle, last = (StageRole(r, 3, False, 2 * r, 2 * r + 2) for r in range(3))
    assert (first.embeds, first.sends_activations, first.awaits_token, first.computes_logits) == (True, True, True, False)
    assert (middle.receives_activations, middle.sends_activations, middle.computes_logits) == (True, True, False)
    assert (last.computes_logits, last.returns_token, last.sends_activations) == (True, True, False)
    tensor = StageRole(1, 2, True, 0, 6)
    assert (tensor.embeds, tensor.computes_logits, tensor.sends_activations, tensor.returns_token) == (True, True, False, False)


@pytest.mark.parametrize(
    ("start", "end", "world", "sharding", "match"),
    [(0, 7, 2, "Pipeline", "outside"), (0, 3, 1, "Pipeline", "all 6"), (0, 3, 2, "Tensor", "all 6")],
)
def test_bad_layer_ranges_are_refused(start, end, world, sharding, match) -> None:
    with pytest.raises(ModelLoadFailed, match=match):
        check_layer_range(shard(0, world, start, end), 6, sharding)


@pytest.mark.parametrize(
    ("world", "heads", "kv", "mlp", "ok"),
    [(2, 4, 2, 384, True), (3, 4, 2, 384, False), (4, 4, 2, 384, False), (2, 4, 2, 385, False)],
)
def test_tensor_split_rule(world, heads, kv, mlp, ok) -> None:
    assert (tensor_split_error(world, heads, kv, mlp) is None) == ok


def test_sampling_defaults_and_seed() -> None:
    p = resolve_sampling(None, None, None, None, fresh_seed=(1 << 40) + 5)
    assert (p.temperature, p.seed) == (DEFAULT_TEMPERATURE, 5)
    assert resolve_sampling(0, 0.5, 3, 9, fresh_seed=1).greedy


def test_byte_level_alphabet_covers_every_byte_once() -> None:
    alphabet = byte_level_alphabet()
    assert sorted(alphabet.values()) == list(range(256))
    assert alphabet["A"] == ord("A") and alphabet["\u0120"] == ord(" ")  # 'Ġ' is the space


def test_watchdog_fires_only_for_an_overdue_guard() -> None:
    fired: list[str] = []
    watchdog = EvalWatchdog(0.3, on_expiry=fired.append)
    try:
        with watchdog.guard("quick"):
            pass
        time.sleep(0.5)
        assert fired == []
        with watchdog.guard("stuck"):
            deadline = time.monotonic() + 5
            while not fired and time.monotonic() < deadline:
                time.sleep(0.05)
        assert fired and "stuck did not complete within 0.3s" in fired[0]
    finally:
        watchdog.close()


# ---------------------------------------------------------------------------------------
# One rank, in process
# ---------------------------------------------------------------------------------------


def test_single_rank_decodes_the_reference_greedy_tokens(one_rank, reference) -> None:
    for prompt in PROMPTS:
        tokens = run(one_rank, greedy(prompt))
        assert ids(tokens) == reference[prompt], prompt
        assert tokens[-1].finish_reason == "length"
        assert tokens[-1].usage is not None and tokens[-1].usage.completion_tokens == DECODE_TOKENS


def test_chat_uses_the_template_and_counts_usage(one_rank) -> None:
    request = TextGenerationParams(model_id=MODEL, messages=[ChatMessage(role="user", content="Hello!")],
                                   max_tokens=5, temperature=0)
    prompt = one_rank.prompt_tokens(request)
    assert prompt[0] == 0 and prompt.count(0) == 1  # BOS once: the template writes it
    tokens = run(one_rank, request)
    assert tokens[-1].usage.prompt_tokens == len(prompt)
    assert "".join(t.text for t in tokens)


def test_output_of_a_template_opened_think_block_starts_with_the_tag(one_rank, monkeypatch) -> None:
    """A template that opens the think block itself (DeepSeek-R1 style): the engine says the
    `<think>` first, so the API tells the reasoning from the answer; not under a grammar."""
    tokenizer = one_rank._tokenizer
    render = tokenizer.apply_chat_template
    monkeypatch.setattr(tokenizer, "apply_chat_template", lambda *args, **kwargs: render(*args, **kwargs) + "<think>\n")
    request = TextGenerationParams(model_id=MODEL, messages=[ChatMessage(role="user", content="hi")],
                                   max_tokens=3, temperature=0)
    tokens = run(one_rank, request)
    assert (tokens[0].text, tokens[0].token_id, tokens[0].prompt_tokens) == (
        "<think>", None, len(one_rank.prompt_tokens(request)))
    assert len(tokens) == 4 and tokens[1].prompt_tokens is None and tokens[-1].usage.completion_tokens == 3
    forced = request.model_copy(update={"response_format": ResponseFormat(type="json_object")})
    assert run(one_rank, forced)[0].token_id is not None


def test_a_continued_turn_goes_on_where_the_output_was_cut(one_rank) -> None:
    """`continue_from` (a spent thinking budget's continuation): the prompt is the first
    run's followed by the text it generated (tokenized afresh: Hugging Face's BPE may merge
    a greedy output's tokens differently), and the turn goes on from there."""
    request = TextGenerationParams(model_id=MODEL, messages=[ChatMessage(role="user", content="Hello!")],
                                   max_tokens=16, temperature=0)
    head = "".join(t.text for t in run(one_rank, request)[:8])
    more = request.model_copy(update={"continue_from": head, "max_tokens": 8})
    prompt, continued = one_rank.prompt_tokens(request), one_rank.prompt_tokens(more)
    assert continued[:len(prompt)] == prompt and one_rank._tokenizer.decode(continued[len(prompt):]) == head
    rest = run(one_rank, more)
    assert rest[-1].usage.prompt_tokens == len(continued) and rest[-1].usage.completion_tokens == 8


def test_seeded_sampling_is_reproducible_and_seeds_differ(one_rank) -> None:
    request = params("What is a node?", max_tokens=16, temperature=1.0, seed=11)
    first, second = ids(run(one_rank, request)), ids(run(one_rank, request))
    assert first == second
    assert first != ids(run(one_rank, params("What is a node?", max_tokens=16, temperature=1.0, seed=12)))


def test_min_p_of_one_keeps_only_the_most_likely_token(one_rank) -> None:
    """min_p drops every token below min_p x the top probability: at 1.0 only the top one
    is left, so sampling at any temperature gives the greedy tokens."""
    sampled = params("What is a node?", max_tokens=16, temperature=1.5, top_k=0, top_p=1.0, min_p=1.0, seed=11)
    assert ids(run(one_rank, sampled)) == ids(run(one_rank, greedy("What is a node?", max_tokens=16)))


def test_seeded_sampling_is_the_same_batched_or_not(engine, unbatched) -> None:
    request = params("What is a node?", max_tokens=16, temperature=1.0, top_p=0.9, top_k=20, seed=11)
    assert ids(run(engine, request)) == ids(run(unbatched, request))


def test_stop_string_ends_the_stream_before_it(one_rank, reference) -> None:
    full = "".join(t.text for t in run(one_rank, greedy(PROMPTS[0])))
    stop = full[10:14]
    tokens = run(one_rank, params(PROMPTS[0], max_tokens=DECODE_TOKENS, temperature=0, stop=[stop]))
    assert tokens[-1].finish_reason == "stop"
    assert "".join(t.text for t in tokens) == full[: full.index(stop)]


def test_cancellation_stops_at_the_next_token(one_rank) -> None:
    cancelled = threading.Event()
    got = []
    for token in one_rank.generate(params(PROMPTS[1], max_tokens=200, temperature=0), cancelled):
        got.append(token)
        if len(got) == 3:
            cancelled.set()
    assert len(got) == 3 and got[-1].finish_reason is None
    assert one_rank.in_flight == 0
    assert ids(run(one_rank, greedy(PROMPTS[1], 4)))  # the engine serves the next request


def test_max_tokens_ends_the_stream_as_length(one_rank, reference) -> None:
    tokens = run(one_rank, greedy(PROMPTS[2], max_tokens=5))
    assert ids(tokens) == reference[PROMPTS[2]][:5] and tokens[-1].finish_reason == "length"


def test_prompt_longer_than_the_context_is_refused(tiny_hf) -> None:
    small = MlxEngine()
    small.load(spec_for(local_instance(CARD, 1).model_copy(update={"context_token_limit": 8}), tiny_hf))
    with pytest.raises(PromptTooLong):
        run(small, params("It rained again on Thursday and the river rose over the old stone bridge"))


def test_load_refuses_a_non_mlx_backend(tiny_hf) -> None:
    instance = local_instance(CARD, 1)
    instance = instance.model_copy(update={"shards": [instance.shards[0].model_copy(update={"backend": "llama_cpp-cpu"})]})
    with pytest.raises(ModelLoadFailed, match="not an mlx backend"):
        MlxEngine().load(spec_for(instance, tiny_hf))
    with pytest.raises(EngineNotLoaded):
        run(MlxEngine(), greedy("x"))


# ---------------------------------------------------------------------------------------
# Groups of real rank processes on loopback
# ---------------------------------------------------------------------------------------


def assert_group_matches(reports, expected: list[list[int]]) -> None:
    for report in reports:
        assert report.ok, f"rank {report.rank}: {report.error}"
    assert reports[0].tokens == expected


@pytest.mark.parametrize("world", [2, 3])
def test_pipeline_group_decodes_exactly_what_one_rank_does(tiny_hf, one_rank_tokens, world) -> None:
    reports = run_group(local_instance(CARD, world, "Pipeline"), CARD, tiny_hf, GROUP_REQUESTS, timeout_s=100)
    assert_group_matches(reports, one_rank_tokens)
    # Activations really moved: every rank but the last sent hidden states for every position.
    assert all(r.bytes_sent > 0 for r in reports)


SHAPED_REQUESTS = [
    params("It rained again on Thursday and the", max_tokens=16, temperature=0.9, seed=4, logprobs=True,
           top_logprobs=2, presence_penalty=1.0, logit_bias={7: 2.0},
           response_format=ResponseFormat(type="json_object")),
]
"""A request rank 0 shapes (logprobs, penalty, bias, grammar): a tensor group's rank 0 computes
the logits, so it serves these exactly as one rank does (a pipeline's last rank samples, and
is refused them by the traits table)."""


def test_tensor_group_decodes_exactly_what_one_rank_does(tiny_hf, engine, one_rank_tokens) -> None:
    shaped = [ids(run(engine, request)) for request in SHAPED_REQUESTS]
    reports = run_group(local_instance(CARD, 2, "Tensor"), CARD, tiny_hf, [*GROUP_REQUESTS, *SHAPED_REQUESTS],
                        timeout_s=100)
    assert_group_matches(reports, one_rank_tokens + shaped)


def test_tensor_ranks_compute_the_unsharded_logits(tiny_hf) -> None:
    import numpy as np

    tokens = [0, 76, 77, 300, 185]
    (single,) = run_tensor_logits(local_instance(CARD, 1), tiny_hf, tokens).values()
    sharded = run_tensor_logits(local_instance(CARD, 2, "Tensor"), tiny_hf, tokens)
    assert single[1] == "" and all(error == "" for _, error in sharded.values()), sharded
    for rank, (logits, _) in sharded.items():
        np.testing.assert_allclose(np.array(logits), np.array(single[0]), rtol=1e-5, atol=1e-4, err_msg=f"rank {rank}")


def test_a_group_that_cannot_form_fails_within_its_deadline(tiny_hf) -> None:
    deadline_s = 3.0
    # Only rank 0 of a 2-rank group starts: its neighbour never connects. `timeout_s` is a
    # hang guard only: the rank must give up by itself, with the deadline's own error.
    (report,) = run_group(local_instance(CARD, 2, "Pipeline"), CARD, tiny_hf, [greedy("x")], ranks=[0],
                          env={GROUP_CONNECT_DEADLINE_ENV: str(deadline_s)}, timeout_s=120)
    assert not report.ok
    assert "GroupFormationFailed" in report.error and f"within {deadline_s:g}s" in report.error


# ---------------------------------------------------------------------------------------
# Batching (single rank, on by default)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, DEFAULT_BATCH_WIDTH),
        ("", DEFAULT_BATCH_WIDTH),
        ("  ", DEFAULT_BATCH_WIDTH),
        ("1", 1),
        (" 4 ", 4),
        ("0", 1),
        ("-3", 1),
        (str(MAX_BATCH_WIDTH), MAX_BATCH_WIDTH),
        ("1000", MAX_BATCH_WIDTH),
        ("eight", DEFAULT_BATCH_WIDTH),
        ("2.5", DEFAULT_BATCH_WIDTH),
    ],
)
def test_batch_width(raw, expected) -> None:
    assert batch_width({} if raw is None else {BATCH_WIDTH_ENV: raw}) == expected


def test_batching_is_on_by_default() -> None:
    assert batch_width({}) == DEFAULT_BATCH_WIDTH > 1


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (["KVCache", "KVCache"], True),
        (["RotatingKVCache", "KVCache"], True),
        (["QuantizedKVCache"], False),
        (["KVCache", "ChunkedKVCache"], False),
    ],
)
def test_batchable_needs_every_layer_cache_to_merge(kinds, expected) -> None:
    from mlx_lm.models import cache

    def make(kind: str):
        return getattr(cache, kind)(**({"max_size": 8} if kind == "RotatingKVCache" else
                                       {"chunk_size": 8} if kind == "ChunkedKVCache" else {}))

    assert batchable([make(k) for k in kinds]) is expected


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [([], False), (["KVCache", "KVCache"], True), (["RotatingKVCache", "KVCache"], False)],
)
def test_batch_prefix_reuse_needs_plain_kv_caches(kinds, expected) -> None:
    from mlx_lm.models import cache

    from skulk.worker.engines.mlx.prefix import reusable_in_batch

    layers = [cache.RotatingKVCache(max_size=8) if k == "RotatingKVCache" else cache.KVCache() for k in kinds]
    assert reusable_in_batch(layers) is expected


def test_concurrent_requests_progress_together_by_default(engine, reference) -> None:
    """Four clients at once on a default single-rank engine: each holds after its first token
    until all four have one, so none can finish first unless all four are in flight together
    (one at a time, the second client would be refused or wait forever)."""
    assert engine.concurrency == DEFAULT_BATCH_WIDTH >= 4
    prompts = [*PROMPTS, PROMPTS[0]]
    gate = threading.Barrier(len(prompts), timeout=60)
    events: list[tuple[str, int]] = []
    lock = threading.Lock()
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            tokens: list[GeneratedToken] = []
            for token in engine.generate(greedy(prompts[i]), threading.Event()):
                tokens.append(token)
                if len(tokens) == 1:
                    with lock:
                        events.append(("first", i))
                    gate.wait()
            with lock:
                events.append(("done", i))
            results[i] = ids(tokens)
        except BaseException as exc:  # reported below
            errors.append(exc)
            gate.abort()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    kinds = [kind for kind, _ in events]
    assert kinds == ["first"] * len(prompts) + ["done"] * len(prompts), events
    assert [results[i] for i in range(len(prompts))] == [reference[p] for p in prompts]
    assert engine.in_flight == 0


def test_batched_requests_share_steps_and_decode_what_one_request_does(engine, reference, monkeypatch) -> None:
    assert engine.concurrency == DEFAULT_BATCH_WIDTH
    loop = engine._batch
    assert loop is not None
    # The batch loop takes no step until every request has joined, so they share steps
    # however fast the machine decodes (started one by one, a fast machine could finish the
    # first request before the last one is in). Each step's batch size is recorded.
    take_commands = loop._take_commands
    joined = threading.Event()
    step_sizes: list[int] = []

    def take_until_all_joined(generator, block: bool) -> None:
        take_commands(generator, block)
        while not joined.is_set() and loop._active:
            if len(loop._active) == len(PROMPTS):
                joined.set()
                break
            take_commands(generator, True)  # waits for the next request to join
        if loop._active:
            step_sizes.append(len(loop._active))

    monkeypatch.setattr(loop, "_take_commands", take_until_all_joined)
    results: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    # Each client holds after its first token until every client has one: all generations
    # are then in flight at once, and the engine's in-flight count must say so.
    first_tokens = threading.Barrier(len(PROMPTS) + 1, timeout=60)
    release = threading.Event()

    def one(prompt: str) -> None:
        try:
            tokens: list[GeneratedToken] = []
            for token in engine.generate(greedy(prompt), threading.Event()):
                tokens.append(token)
                if len(tokens) == 1:
                    first_tokens.wait()
                    assert release.wait(60)
            results[prompt] = ids(tokens)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,)) for p in PROMPTS]
    for t in threads:
        t.start()
    try:
        first_tokens.wait()
        in_flight_together = engine.in_flight
    finally:
        release.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert results == reference
    assert in_flight_together == len(PROMPTS)  # true in-flight: several generations at once
    assert step_sizes and step_sizes[0] == len(PROMPTS)  # they decoded in one batch
    assert engine.in_flight == 0


def test_a_cancelled_batched_request_leaves_the_others_running(engine, reference) -> None:
    cancelled = threading.Event()
    other: list[int] = []
    runner = threading.Thread(target=lambda: other.extend(ids(run(engine, greedy(PROMPTS[2])))))
    got = []
    for token in engine.generate(params(PROMPTS[1], max_tokens=200, temperature=0), cancelled):
        got.append(token)
        if len(got) == 2:
            runner.start()
        if len(got) == 4:
            cancelled.set()
    runner.join(60)
    assert len(got) == 4 and got[-1].finish_reason is None
    assert other == reference[PROMPTS[2]]
    assert engine.in_flight == 0


def switches(thread: threading.Thread) -> int:
    """How often the kernel has switched `thread` out (a wake-up is a switch out and back)."""
    assert thread.native_id is not None
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)


IDLE_WINDOW_S = 1.5
"""How long an idle batch loop is watched: a loop that polled its queue (it used to, every
0.5 s) is switched out several times in it; a blocked one never."""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_an_idle_batch_loop_never_wakes_and_close_ends_it(tiny_hf) -> None:
    engine = MlxEngine()
    engine.load(spec_for(local_instance(CARD, 1), tiny_hf))
    engine.warm_up()
    loop = engine._batch
    assert loop is not None
    thread = loop._thread
    try:
        assert ids(run(engine, greedy(PROMPTS[0], 4)))
        # Settled: nothing queued or active, and no switch across a short look.
        deadline = time.monotonic() + 30
        while True:
            before = switches(thread)
            time.sleep(0.2)  # a look, not a synchronisation
            if not loop._active and loop._commands.empty() and switches(thread) == before:
                break
            assert time.monotonic() < deadline, "the batch loop never went idle"
        before = switches(thread)
        time.sleep(IDLE_WINDOW_S)  # the measured window
        assert switches(thread) == before
    finally:
        engine.close()
    assert not thread.is_alive()  # close woke the blocked loop and it ended


# ---------------------------------------------------------------------------------------
# Rendezvous (sockets only, in threads)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 3])
def test_rendezvous_completes_when_every_neighbour_is_up(world) -> None:
    from skulk.worker.engines.mlx.group import rendezvous
    from tests.worker.engines.mlx_ranks import free_ports

    addresses = [f"127.0.0.1:{p}" for p in free_ports(world)]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            time.sleep(0.1 * r)  # ranks arrive at different times
            rendezvous(addresses, r, 10.0, "inst")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert errors == [] and not any(t.is_alive() for t in threads)
    # Every ring port is free again for MLX to bind (no listener, no TIME_WAIT on it).
    import socket

    for address in addresses:
        host, port = address.rsplit(":", 1)
        with socket.socket() as s:
            s.bind((host, int(port)))


def test_rendezvous_names_the_missing_neighbour_at_its_deadline() -> None:
    from skulk.worker.engines.mlx.group import rendezvous
    from tests.worker.engines.mlx_ranks import free_ports

    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    # It gives up by itself (the module timeout is only a hang guard), with the deadline's own
    # error naming the deadline it kept.
    with pytest.raises(GroupFormationFailed, match=rf"no answer from rank 1 at {addresses[1]}.*within 1s$"):
        rendezvous(addresses, 0, 1.0, "inst")


def test_rendezvous_ignores_a_peer_of_another_instance() -> None:
    from skulk.worker.engines.mlx.group import rendezvous
    from tests.worker.engines.mlx_ranks import free_ports

    addresses = [f"127.0.0.1:{p}" for p in free_ports(2)]
    errors: list[BaseException] = []

    def rank(r: int, tag: str) -> None:
        try:
            rendezvous(addresses, r, 2.0, tag)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(0, "a")), threading.Thread(target=rank, args=(1, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(errors) == 2 and all(isinstance(e, GroupFormationFailed) for e in errors)


@pytest.mark.parametrize(("pin", "value"), [(True, "1"), (False, "0"), (None, None)])
def test_a_cards_metal_fast_synch_pin_reaches_mlx(tiny_hf, monkeypatch, pin, value) -> None:
    """`runtime.metal_fast_synch` is MLX's own switch (MLX_METAL_FAST_SYNCH) in the runner's
    process, set before MLX first touches the device; unset leaves the node's setting."""
    from skulk.worker.engines.mlx.engine import METAL_FAST_SYNCH_ENV

    monkeypatch.setenv(METAL_FAST_SYNCH_ENV, "node")
    card = CARD.model_copy(update={"runtime": CARD.runtime.model_copy(update={"metal_fast_synch": pin})})
    engine = MlxEngine()
    instance = local_instance(CARD, 1)
    engine.load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=card, model_path=str(tiny_hf)))
    try:
        assert os.environ[METAL_FAST_SYNCH_ENV] == (value or "node")
    finally:
        engine.close()
