"""Prompt-lookup speculation on one MLX rank (`runtime.speculative = "ngram"`): the greedy
tokens are mlx-lm's own, drafts are counted in the usage, seeded sampling stays seeded, a
request whose sampler reads each token's logits steps plainly, and what cannot draft is
refused at load."""

from __future__ import annotations

import re

import pytest

from skulk.worker.engines.base import ModelLoadFailed, ShardSpec
from skulk.worker.engines.mlx.engine import MlxEngine
from skulk.worker.engines.mlx.speculate import Speculation, speculating
from tests.worker.engines.mlx_ranks import local_instance
from tests.worker.engines.test_mlx_engine import CARD, greedy, ids, params, run, tiny_hf  # noqa: F401

pytestmark = pytest.mark.timeout(180)

# A prompt that repeats itself: its n-grams recur, so drafts are proposed from the start.
REPEATING = "one two three four one two three four one two three four one two"
DECODE = 48
SPECULATING = CARD.model_copy(update={"runtime": CARD.runtime.model_copy(update={"speculative": "ngram"})})


@pytest.fixture(scope="module")
def drafting(tiny_hf):
    engine = MlxEngine()
    instance = local_instance(SPECULATING, 1)
    engine.load(ShardSpec(instance=instance, runner_id=instance.shards[0].runner_id, card=SPECULATING,
                          model_path=str(tiny_hf)))
    engine.warm_up()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(tiny_hf) -> dict[str, list[int]]:
    """mlx-lm's own greedy decode of the whole model, per prompt."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(tiny_hf))
    return {prompt: [int(t) for t, _ in generate_step(mx.array(tokenizer.encode(prompt)), model, max_tokens=DECODE)]
            for prompt in (REPEATING, "The cluster by the sea")}


def test_a_speculating_engine_steps_one_request_at_a_time(drafting):
    assert drafting.concurrency == 1


@pytest.mark.parametrize("prompt", [REPEATING, "The cluster by the sea"])
def test_greedy_tokens_are_mlx_lms_own_and_the_drafts_are_counted(drafting, reference, prompt):
    tokens = run(drafting, greedy(prompt, DECODE))
    assert ids(tokens)[:len(reference[prompt])] == reference[prompt]
    usage = tokens[-1].usage
    assert usage is not None and usage.completion_tokens == len(ids(tokens))
    assert 0 <= usage.accepted_draft_tokens <= usage.drafted_tokens
    if prompt == REPEATING:
        assert usage.drafted_tokens > 0, usage


def test_a_random_model_that_loops_is_drafted_and_mostly_accepted(drafting, reference):
    """Greedy decoding of a random model settles into a loop: prompt lookup drafts the loop."""
    tokens = run(drafting, greedy(REPEATING, 200))
    usage = tokens[-1].usage
    assert usage is not None and usage.accepted_draft_tokens > 0, usage


def test_seeded_sampling_is_reproducible_while_drafting(drafting):
    request = params(REPEATING, max_tokens=32, temperature=0.8, seed=11)
    assert ids(run(drafting, request)) == ids(run(drafting, request))


def test_a_shaped_request_steps_plainly_and_says_it_drafted_nothing(drafting):
    tokens = run(drafting, params(REPEATING, max_tokens=16, temperature=0, logprobs=True, top_logprobs=2))
    usage = tokens[-1].usage
    assert usage is not None and usage.drafted_tokens == 0 and len(ids(tokens)) == 16


def test_the_drafting_engine_stops_at_max_tokens_exactly(drafting):
    for limit in (1, 2, 5, 9):
        assert len(ids(run(drafting, greedy(REPEATING, limit)))) == limit


@pytest.mark.parametrize(("method", "world", "trimmable", "refusal"), [
    (None, 1, True, None),
    ("none", 2, False, None),
    ("ngram", 1, True, None),
    ("draft", 1, True, None),
    ("eagle", 1, True, "drafts with 'ngram', 'draft' only"),
    ("ngram", 2, True, "one MLX rank holding the whole model"),
    ("draft", 2, True, "draft speculation runs on one MLX rank"),
    ("ngram", 1, False, "cannot always give back rejected drafts"),
])
def test_speculating(method, world, trimmable, refusal):
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    cache = (lambda: [KVCache()]) if trimmable else (lambda: [RotatingKVCache(max_size=4)])
    if refusal is None:
        assert speculating(method, world, cache) is ((method or "none") != "none")
    else:
        with pytest.raises(ModelLoadFailed, match=re.escape(refusal)):
            speculating(method, world, cache)


def test_speculation_hands_out_verified_tokens_and_keeps_the_cache_to_what_was_fed():
    """The pure bookkeeping, with a scripted model: drafts from the context, the model's own
    token after each, the rejected drafts dropped, the rest handed out one per call."""
    fed: list[int] = []
    dropped: list[int] = []
    checked: list[list[int]] = []

    def check(tokens: list[int]) -> list[int]:
        checked.append(tokens)
        return [1, 2, 9, 0, 0]  # agrees with drafts 1 and 2, then says 9 instead of 3

    # No earlier (8, 7): one plain step.
    drafting = Speculation(context=[7, 1, 2, 3, 8, 7], max_new=10)
    assert drafting.next_token(7, lambda _: 99, check, fed.extend, dropped.append) == 99
    assert fed == [7] and checked == [] and dropped == []
    # (8, 7) was followed by 1, 2, 3, 5: drafted, checked in one step, two kept.
    drafting = Speculation(context=[8, 7, 1, 2, 3, 5, 8, 7], max_new=10)
    first = drafting.next_token(7, lambda _: 99, check, fed.extend, dropped.append)
    second = drafting.next_token(first, lambda _: 99, check, fed.extend, dropped.append)
    third = drafting.next_token(second, lambda _: 99, check, fed.extend, dropped.append)
    assert [first, second, third] == [1, 2, 9]  # two drafts kept, then the model's own token
    assert checked == [[7, 1, 2, 3, 5]]
    assert fed == [7, 7, 1, 2] and dropped == [2]  # drafts 3 and 5 given back
    assert (drafting.drafted, drafting.accepted) == (4, 2)
    assert drafting.context[-3:] == [1, 2, 9]


def test_drafts_never_reach_past_max_tokens():
    drafting = Speculation(context=[1, 2, 3, 1, 2], max_new=2)
    drafting.handed(5)  # the prefill's token: one left, so nothing to draft
    assert drafting.next_token(5, lambda _: 42, lambda t: [0] * len(t), lambda _: None, lambda _: None) == 42
    assert drafting.drafted == 0


def test_the_drafter_is_asked_for_no_more_than_the_room_left():
    """Any drafter (prompt lookup, a draft model) is told how many tokens may still follow."""
    asked: list[tuple[int, int]] = []

    def drafter(context: list[int], room: int) -> list[int]:
        asked.append((len(context), room))
        return [7] * room

    drafting = Speculation(context=[1, 2, 3], max_new=4, drafter=drafter)
    drafting.handed(5)  # the prefill's token
    first = drafting.next_token(5, lambda _: 42, lambda t: [7] * len(t), lambda _: None, lambda _: None)
    assert asked == [(4, 2)] and first == 7  # two drafts kept, then the model's own token: 4 in all
    assert [drafting.next_token(7, lambda _: 42, lambda t: [7] * len(t), lambda _: None, lambda _: None)
            for _ in range(2)] == [7, 7]
    assert (drafting.drafted, drafting.accepted) == (2, 2) and len(drafting.context) == 3 + 4
