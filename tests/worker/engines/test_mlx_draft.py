"""Draft-model speculation on one MLX rank (`runtime.speculative = "draft"`): a small mlx-lm
model of the target's tokenizer drafts, the target verifies in one step. The greedy tokens
are mlx-lm's own with any draft; the model as its own draft has every draft accepted; a
smaller random draft (`TINY_DRAFT_SPEC`) is drafted and accepted as chance has it; seeded
sampling stays seeded; what cannot draft is refused at load, by name."""

from __future__ import annotations

import json
import shutil

import pytest

from skulk.models.tiny_models import TINY_DRAFT_SPEC, generate_tiny_model
from skulk.worker.engines.base import ModelLoadFailed, ShardSpec
from skulk.worker.engines.mlx.draft_model import DRAFT_MODEL_TOKENS, DraftModel, common_prefix
from skulk.worker.engines.mlx.engine import PREFILL_CHUNK_TOKENS, MlxEngine
from tests.worker.engines.mlx_ranks import local_instance
from tests.worker.engines.test_mlx_engine import CARD, greedy, ids, params, run, tiny_hf  # noqa: F401

pytestmark = pytest.mark.timeout(180)

PROMPTS = ("The cluster by the sea", "one two three four one two three four")
DECODE = 40
DRAFTING = CARD.model_copy(update={"runtime": CARD.runtime.model_copy(update={"speculative": "draft"})})


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory):
    """A one-layer, half-width random Llama of the tiny tokenizer."""
    return generate_tiny_model(tmp_path_factory.mktemp("tiny-draft"), TINY_DRAFT_SPEC).hf_dir


def _engine(card, model_path, draft_path) -> MlxEngine:
    engine = MlxEngine()
    instance = local_instance(card, 1)
    engine.load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=card,
                          model_path=str(model_path), draft_model_path=str(draft_path) if draft_path else None))
    engine.warm_up()
    return engine


@pytest.fixture(scope="module")
def own_draft(tiny_hf):
    engine = _engine(DRAFTING, tiny_hf, tiny_hf)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def small_draft(tiny_hf, random_draft):
    engine = _engine(DRAFTING, tiny_hf, random_draft)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(tiny_hf) -> dict[str, list[int]]:
    """mlx-lm's own greedy decode of the whole model, per prompt."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    loaded = load(str(tiny_hf))
    model, tokenizer = loaded[0], loaded[1]
    return {prompt: [int(t) for t, _ in generate_step(mx.array(tokenizer.encode(prompt)), model, max_tokens=DECODE)]
            for prompt in PROMPTS}


def test_the_random_draft_shares_the_tokenizer(tiny_hf, random_draft):
    assert (random_draft / "tokenizer.json").read_bytes() == (tiny_hf / "tokenizer.json").read_bytes()
    assert json.loads((random_draft / "config.json").read_text())["num_hidden_layers"] == 1


@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_model_as_its_own_draft_gives_its_own_tokens_and_every_draft_is_accepted(own_draft, reference, prompt):
    assert own_draft.concurrency == 1
    tokens = run(own_draft, greedy(prompt, DECODE))
    assert ids(tokens) == reference[prompt]
    usage = tokens[-1].usage
    assert usage is not None and usage.completion_tokens == DECODE
    print(f"own draft: {usage.accepted_draft_tokens}/{usage.drafted_tokens} accepted")
    assert usage.drafted_tokens > 0 and usage.accepted_draft_tokens == usage.drafted_tokens, usage


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_random_draft_changes_nothing_in_the_greedy_tokens(small_draft, reference, prompt):
    tokens = run(small_draft, greedy(prompt, DECODE))
    assert ids(tokens) == reference[prompt]
    usage = tokens[-1].usage
    assert usage is not None
    print(f"random draft: {usage.accepted_draft_tokens}/{usage.drafted_tokens} accepted")
    assert usage.drafted_tokens > 0 and 0 <= usage.accepted_draft_tokens <= usage.drafted_tokens, usage


def test_seeded_sampling_is_reproducible_while_drafting(small_draft, own_draft):
    """The same seed and draft give the same tokens. (Another draft verifies other spans,
    so the same draws land on other positions: the same distribution, not the same text.)"""
    for engine in (small_draft, own_draft):
        request = params(PROMPTS[0], max_tokens=32, temperature=0.8, seed=11)
        first = ids(run(engine, request))
        assert first == ids(run(engine, request)) and len(first) == 32
        usage = run(engine, request)[-1].usage
        assert usage is not None and usage.drafted_tokens > 0


def test_a_shaped_request_steps_plainly_and_says_it_drafted_nothing(own_draft):
    tokens = run(own_draft, params(PROMPTS[0], max_tokens=12, temperature=0, logprobs=True, top_logprobs=2))
    usage = tokens[-1].usage
    assert usage is not None and usage.drafted_tokens == 0 and len(ids(tokens)) == 12


def test_the_drafting_engine_stops_at_max_tokens_exactly(own_draft):
    for limit in (1, 2, 3, DRAFT_MODEL_TOKENS + 2, 11):
        assert len(ids(run(own_draft, greedy(PROMPTS[1], limit)))) == limit


def test_the_draft_gives_back_what_the_context_no_longer_holds(tiny_hf):
    """A draft whose cache holds another context's tokens proposes what a fresh one does."""
    warm = DraftModel.load(str(tiny_hf), 0, PREFILL_CHUNK_TOKENS)
    first = [5, 6, 7, 8, 9, 10, 11]
    drafts = warm.propose(first, DRAFT_MODEL_TOKENS)
    assert len(drafts) == DRAFT_MODEL_TOKENS and warm.fed == first + drafts[:-1]
    for context in ([5, 6, 7, 40, 41], first, first[:3], [99]):
        fresh = DraftModel.load(str(tiny_hf), 0, 3)  # a small prefill chunk: several chunks
        assert warm.propose(context, DRAFT_MODEL_TOKENS) == fresh.propose(context, DRAFT_MODEL_TOKENS), context
    assert warm.propose([1, 2], 0) == [] and len(warm.propose([1, 2], 2)) == 2


@pytest.mark.parametrize(("fed", "context", "shared"), [
    ([], [1, 2], 0),
    ([1, 2, 3], [1, 2, 3], 3),
    ([1, 2, 3], [1, 2], 2),
    ([1, 2], [1, 2, 3], 2),
    ([1, 9, 3], [1, 2, 3], 1),
])
def test_common_prefix(fed, context, shared):
    assert common_prefix(fed, context) == shared


def test_a_draft_card_without_its_draft_is_refused_at_load(tiny_hf, tmp_path):
    with pytest.raises(ModelLoadFailed, match="not on this node as an MLX model directory"):
        _engine(DRAFTING, tiny_hf, None)
    other_vocab = tmp_path / "other-vocab"
    shutil.copytree(tiny_hf, other_vocab)
    config = json.loads((other_vocab / "config.json").read_text())
    (other_vocab / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] * 2}))
    with pytest.raises(ModelLoadFailed, match="must share the target's tokenizer"):
        _engine(DRAFTING, tiny_hf, other_vocab)
