"""The MLX engine honours what the llama.cpp engine does, on the generated tiny Llama: logprobs,
logit bias, penalties, structured output and forced tool calls (llguidance over the shared
GBNF grammar), seeds; in the batch loop (one rank's default) and in lockstep (width 1), alone
and sharing a batch. Plus the pure logit shaping both engines share
(`skulk.worker.engines.logits`)."""

from __future__ import annotations

import collections
import json
import math
import threading

import jsonschema_rs
import numpy as np
import pytest

from skulk.shared.types.tasks import ResponseFormat, TextGenerationParams, ToolSpec
from skulk.worker.engines.base import EngineError
from skulk.worker.engines.logits import GrammarRejected, InvalidTokens, apply_penalties, log_softmax_at
from skulk.worker.engines.mlx.engine import MlxEngine
from skulk.worker.engines.mlx.sampling import Shaping, shaping_of
from tests.worker.engines.mlx_ranks import local_instance
from tests.worker.engines.test_mlx_engine import CARD, MODEL, spec_for, tiny_hf  # noqa: F401

pytestmark = pytest.mark.timeout(180)

PROMPT = "The weather today is"
LONG_PROMPT = "the the the the"
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
}, "required": ["name", "age", "tags"], "additionalProperties": False}
WEATHER = ToolSpec(name="get_weather", description="", parameters={
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]})


def params(prompt: str = PROMPT, **kwargs) -> TextGenerationParams:
    return TextGenerationParams(model_id=MODEL, prompt=prompt, **kwargs)


@pytest.fixture(scope="module")
def engine(tiny_hf):
    """One rank as deployed: batched."""
    engine = MlxEngine()
    engine.load(spec_for(local_instance(CARD, 1), tiny_hf))
    engine.warm_up()
    yield engine
    engine.close()


def tokens(engine, request):
    return list(engine.generate(request, threading.Event()))


def token_ids(engine, request) -> list[int]:
    return [t.token_id for t in tokens(engine, request) if t.token_id is not None]


def answer(engine, request) -> tuple[str, str | None]:
    out = tokens(engine, request)
    return "".join(t.text for t in out), out[-1].finish_reason


# -- pure ---------------------------------------------------------------------------------


def test_penalties_are_llama_cpp_arithmetic() -> None:
    logits = np.array([2.0, -2.0, 1.0, 0.5], dtype=np.float32)
    apply_penalties(logits, [0, 0, 1, 3], repeat=2.0, frequency=0.5, presence=0.25)
    # token 0: 2/2 - 2*0.5 - 0.25; token 1: -2*2 - 0.5 - 0.25; token 2 unseen; token 3: 0.5/2 - 0.75
    assert logits.tolist() == pytest.approx([-0.25, -4.75, 1.0, -0.5])


def test_log_softmax_at_reports_the_chosen_and_the_best() -> None:
    logits = np.log(np.array([0.5, 0.25, 0.25], dtype=np.float64))
    chosen, best = log_softmax_at(logits, 1, 2)
    assert chosen == pytest.approx(math.log(0.25))
    assert best[0] == (0, pytest.approx(math.log(0.5)))


@pytest.mark.parametrize(("request_kwargs", "idle"), [
    ({}, True),
    ({"temperature": 0.7, "seed": 3, "stop": ["x"]}, True),
    ({"logprobs": True}, False),
    ({"logit_bias": {3: 1.0}}, False),
    ({"presence_penalty": 0.5}, False),
    ({"repeat_penalty": 1.1}, False),
    ({"response_format": ResponseFormat(type="json_object")}, False),
    ({"tools": [WEATHER], "tool_choice": "required"}, False),
    ({"tools": [WEATHER], "tool_choice": "auto"}, True),
])
def test_only_a_shaping_request_leaves_the_plain_sampler(request_kwargs, idle) -> None:
    assert shaping_of(params(**request_kwargs)).idle is idle


def test_shaping_carries_logprobs_as_asked() -> None:
    assert shaping_of(params(logprobs=True, top_logprobs=3)) == Shaping(top_logprobs=3)
    assert shaping_of(params(logprobs=True)).top_logprobs == 0


# -- the engine -----------------------------------------------------------------------------


def test_logprobs_report_the_chosen_token_and_the_best(engine) -> None:
    plain = token_ids(engine, params(temperature=0, max_tokens=6))
    scored = tokens(engine, params(temperature=0, max_tokens=6, logprobs=True, top_logprobs=3))
    assert [t.token_id for t in scored] == plain  # asking for logprobs changes nothing sampled
    for token in scored:
        assert token.logprob <= 0.0
        assert len(token.top_logprobs) == 3
        best = token.top_logprobs[0]
        # Greedy: the chosen token is the most likely one, reported with the same logprob.
        assert best.token_id == token.token_id and best.logprob == pytest.approx(token.logprob)
        assert [t.logprob for t in token.top_logprobs] == sorted((t.logprob for t in token.top_logprobs), reverse=True)


def test_logit_bias_bans_and_forces_tokens(engine) -> None:
    greedy = token_ids(engine, params(temperature=0, max_tokens=8))
    banned = token_ids(engine, params(temperature=0, max_tokens=8, logit_bias={greedy[0]: -100}))
    assert banned[0] != greedy[0] and greedy[0] not in banned
    forced = token_ids(engine, params(temperature=0, max_tokens=5, logit_bias={7: 100}))
    assert forced == [7] * 5


def test_logit_bias_outside_the_vocabulary_is_refused(engine) -> None:
    with pytest.raises(InvalidTokens, match="logit_bias"):
        tokens(engine, params(logit_bias={10**6: 1.0}))


def distinct(engine, **penalty) -> int:
    return len(collections.Counter(token_ids(engine, params(LONG_PROMPT, temperature=0, max_tokens=64, **penalty))))


@pytest.mark.parametrize(("penalty", "more_varied"), [
    ({"frequency_penalty": 2.0}, True),
    ({"presence_penalty": 2.0}, True),
    ({"repeat_penalty": 1.8}, True),
    ({"frequency_penalty": -2.0}, False),
])
def test_penalties_move_greedy_output_the_way_their_sign_says(engine, penalty, more_varied) -> None:
    plain, penalised = distinct(engine), distinct(engine, **penalty)
    assert (penalised > plain) if more_varied else (penalised < plain), (plain, penalised)


@pytest.mark.parametrize("seed", range(3))
def test_a_json_schema_response_always_validates(engine, seed) -> None:
    text, finish = answer(engine, params(temperature=1.0, seed=seed, max_tokens=200,
                                         response_format=ResponseFormat(type="json_schema", json_schema=PERSON)))
    assert finish == "stop"  # under the grammar the model can only end once the document is complete
    assert jsonschema_rs.validator_for(PERSON).is_valid(json.loads(text)), text


def closing_bias(engine) -> dict[int, float]:
    """Random text almost never closes a string, so the quote and brace are favoured: what is
    checked is that the grammar makes every ending a JSON object."""
    return {engine._token_bytes.index(b'"'): 10.0, engine._token_bytes.index(b"}"): 10.0}


def json_object_request(engine, seed: int) -> TextGenerationParams:
    return params(temperature=1.0, seed=seed, max_tokens=300, logit_bias=closing_bias(engine),
                  response_format=ResponseFormat(type="json_object"))


@pytest.mark.parametrize("seed", range(2))
def test_a_json_object_response_is_an_object(engine, seed) -> None:
    text, finish = answer(engine, json_object_request(engine, seed))
    assert finish == "stop"
    assert isinstance(json.loads(text), dict), text


def test_a_forced_tool_call_is_a_valid_call(engine) -> None:
    text, finish = answer(engine, params(temperature=1.0, seed=5, max_tokens=200, tools=[WEATHER],
                                         tool_choice={"type": "function", "function": {"name": "get_weather"}}))
    call = json.loads(text)
    assert finish == "stop" and call["name"] == "get_weather" and isinstance(call["parameters"]["city"], str), text


def test_an_unenforceable_schema_fails_the_request(engine) -> None:
    with pytest.raises(GrammarRejected, match="'pattern'"):
        tokens(engine, params(response_format=ResponseFormat(type="json_schema",
                                                             json_schema={"type": "string", "pattern": "^a"})))


def test_a_seeded_shaped_request_is_reproducible(engine) -> None:
    request = params(temperature=1.0, seed=11, max_tokens=12, logprobs=True, presence_penalty=0.5)
    first, again = tokens(engine, request), tokens(engine, request)
    assert [(t.token_id, t.logprob) for t in first] == [(t.token_id, t.logprob) for t in again]


def test_a_pipeline_rank_zero_refuses_shaping_it_cannot_do(engine) -> None:
    from dataclasses import replace

    stage = engine._stage
    engine._stage = replace(stage, role=replace(stage.role, world=2, end_layer=stage.role.end_layer // 2))
    try:
        assert not engine._stage.role.computes_logits
        with pytest.raises(EngineError, match="pipeline"):
            tokens(engine, params(logprobs=True))
    finally:
        engine._stage = stage


@pytest.fixture(scope="module")
def unbatched(tiny_hf):
    from skulk.worker.engines.mlx.batch import BATCH_WIDTH_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BATCH_WIDTH_ENV, "1")
        engine = MlxEngine()
        engine.load(spec_for(local_instance(CARD, 1), tiny_hf))
    engine.warm_up()
    yield engine
    engine.close()


def test_the_batch_loop_shapes_as_lockstep_does(engine, unbatched) -> None:
    assert engine._batch is not None and unbatched._batch is None
    request = params(temperature=0, max_tokens=6, logprobs=True, top_logprobs=2, logit_bias={7: 5.0})
    lockstep, in_batch = tokens(unbatched, request), tokens(engine, request)
    assert [t.token_id for t in in_batch] == [t.token_id for t in lockstep]
    assert [t.logprob for t in in_batch] == pytest.approx([t.logprob for t in lockstep], abs=1e-3)
    penalised = params(LONG_PROMPT, temperature=0.9, seed=3, max_tokens=24, frequency_penalty=1.0, repeat_penalty=1.3)
    assert token_ids(engine, penalised) == token_ids(unbatched, penalised)


SHARED_BATCH = [
    params(temperature=0, max_tokens=12),
    params(temperature=0, max_tokens=8, logprobs=True, top_logprobs=3, logit_bias={7: 4.0}),
    params(LONG_PROMPT, temperature=1.0, seed=9, max_tokens=16, presence_penalty=1.5),
    params(temperature=1.0, seed=2, max_tokens=200, response_format=ResponseFormat(type="json_schema",
                                                                                   json_schema=PERSON)),
]
"""Plain, logprobs + bias, seeded + penalty, and grammar: requests that share one batch."""


def run_together(engine, requests) -> list[list]:
    """Every request at once, each client holding after its first token until all have one
    (so they are in the batch together)."""
    gate = threading.Barrier(len(requests), timeout=60)
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            out = []
            for token in engine.generate(requests[i], threading.Event()):
                out.append(token)
                if len(out) == 1:
                    gate.wait()
            results[i] = out
        except BaseException as exc:  # reported by the caller
            errors.append(exc)
            gate.abort()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return [results[i] for i in range(len(requests))]


def test_requests_sharing_a_batch_each_get_what_they_asked_alone(engine) -> None:
    alone = [tokens(engine, request) for request in SHARED_BATCH]
    together = run_together(engine, SHARED_BATCH)
    for request, a, t in zip(SHARED_BATCH, alone, together, strict=True):
        assert [x.token_id for x in t] == [x.token_id for x in a], request
        if request.logprobs:
            assert [x.logprob for x in t] == pytest.approx([x.logprob for x in a], abs=1e-3)
        assert [x.finish_reason for x in t] == [x.finish_reason for x in a]
    assert all(len(x.top_logprobs) == 3 for x in together[1])
    assert jsonschema_rs.validator_for(PERSON).is_valid(json.loads("".join(x.text for x in together[3])))


class FailingMatcher:
    """A grammar that accepts anything, then rejects its third token."""

    def __init__(self) -> None:
        self.consumed = 0

    def mask(self, logits) -> None:
        pass

    def consume(self, token: int) -> None:
        self.consumed += 1
        if self.consumed == 3:
            raise GrammarRejected(f"token {token} was sampled outside the grammar")


def test_a_request_whose_sampler_fails_fails_alone(engine, monkeypatch) -> None:
    plain = params(temperature=0, max_tokens=24)
    expected = token_ids(engine, plain)
    monkeypatch.setattr(engine, "_grammar_matcher", lambda schema: FailingMatcher())
    failing = params(max_tokens=50, response_format=ResponseFormat(type="json_object"))
    outcome: dict[str, object] = {}

    def run_failing() -> None:
        try:
            outcome["tokens"] = tokens(engine, failing)
        except BaseException as exc:
            outcome["error"] = exc

    other = threading.Thread(target=run_failing)
    got = []
    for token in engine.generate(plain, threading.Event()):
        got.append(token.token_id)
        if len(got) == 1:
            other.start()
    other.join(60)
    assert isinstance(outcome.get("error"), GrammarRejected), outcome
    assert got == expected  # its batch neighbour never noticed
    assert token_ids(engine, plain) == expected and engine.in_flight == 0  # and the engine serves on


# -- a family without a layer adapter runs whole on one rank -------------------------------

GEMMA_CONFIG = {
    "model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "query_pre_attn_scalar": 32, "vocab_size": 512,
    "rms_norm_eps": 1e-6, "sliding_window": 8, "sliding_window_pattern": 3, "max_position_embeddings": 2048,
    "eos_token_id": [1, 4], "bos_token_id": 0,
}
"""A tiny Gemma 3 (sliding-window layers with a window shorter than the test prompts): a
family `mlx_family` has no layer adapter for."""


@pytest.fixture(scope="module", params=["gemma3_text", "gemma3"])
def tiny_gemma(request, tiny_hf, tmp_path_factory):
    """The text model, and the multimodal config layout (the language model's shape in
    `text_config`, as the bundled gemma-3 card's model has it)."""
    import shutil

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import gemma3, gemma3_text

    out = tmp_path_factory.mktemp("tiny-gemma")
    config = {**GEMMA_CONFIG, "num_hidden_layers": CARD.num_layers}
    mx.random.seed(0)
    if request.param == "gemma3":
        config = {"model_type": "gemma3", "vocab_size": config["vocab_size"], "eos_token_id": config["eos_token_id"],
                  "text_config": config}
        model = gemma3.Model(gemma3.ModelArgs.from_dict(config))
    else:
        model = gemma3_text.Model(gemma3_text.ModelArgs.from_dict(config))
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_hf / name).exists():
            shutil.copy(tiny_hf / name, out / name)
    return out


def test_a_family_without_an_adapter_runs_whole_on_one_rank_as_mlx_lm_does(tiny_gemma) -> None:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(tiny_gemma))
    prompt = "It rained again on Thursday and the"
    expected = [int(t) for t, _ in generate_step(mx.array(tokenizer.encode(prompt)), model, max_tokens=20)]
    assert len(tokenizer.encode(prompt)) > GEMMA_CONFIG["sliding_window"]  # the window really slides
    gemma = MlxEngine()
    gemma.load(spec_for(local_instance(CARD, 1), tiny_gemma))
    try:
        gemma.warm_up()
        assert gemma._stage.whole is not None
        got = token_ids(gemma, params(prompt, max_tokens=20, temperature=0))
        assert got == expected[: len(got)] and len(got) >= 1
        scored = tokens(gemma, params(prompt, max_tokens=4, temperature=0, logprobs=True, logit_bias={7: 100}))
        assert [t.token_id for t in scored] == [7] * 4 and all(t.logprob <= 0 for t in scored)
    finally:
        gemma.close()


def test_a_family_without_an_adapter_never_spans_ranks(tiny_gemma) -> None:
    from skulk.worker.engines.base import ModelLoadFailed

    with pytest.raises(ModelLoadFailed, match="no adapter"):
        MlxEngine().load(spec_for(local_instance(CARD, 2), tiny_gemma))
