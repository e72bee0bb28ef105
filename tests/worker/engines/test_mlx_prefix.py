"""The MLX engine's prefix cache on the generated tiny Llama (mlx on the CPU): interleaved
conversations re-use their own KV, hot or restored from the cold store, and produce exactly
the tokens of fresh, uncached requests; unbatched (width 1) and in the batch (the default),
where a request that joins a batch mid-decode starts from its conversation's cached KV."""

from __future__ import annotations

import threading

import pytest

from skulk.shared.prefix_cache import COLD_BUDGET_ENV
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.mlx.batch import BATCH_WIDTH_ENV, DEFAULT_BATCH_WIDTH
from skulk.worker.engines.mlx.engine import MlxEngine
from tests.worker.engines.mlx_ranks import local_instance
from tests.worker.engines.test_llama_cpp_prefix import FOLLOW_UPS, OPENERS
from tests.worker.engines.test_mlx_engine import CARD, MODEL, spec_for, tiny_hf  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(300)


def load(path, budget_mb: str, width: int | None = None) -> MlxEngine:
    """A single-rank engine (batched at the default width unless `width` says otherwise)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(COLD_BUDGET_ENV, budget_mb)
        if width is not None:
            patch.setenv(BATCH_WIDTH_ENV, str(width))
        engine = MlxEngine()
        engine.load(spec_for(local_instance(CARD, 1), path))
    engine.warm_up()
    return engine


def run(engine: MlxEngine, messages: list[ChatMessage]):
    params = TextGenerationParams(model_id=MODEL, messages=messages, temperature=0, max_tokens=10)
    return list(engine.generate(params, threading.Event()))


@pytest.mark.parametrize("width", [1, None], ids=["unbatched", "batched"])
def test_interleaved_conversations_match_fresh_requests_and_hit_the_cache(tiny_hf, width) -> None:
    cached = load(tiny_hf, "64", width)
    baseline = load(tiny_hf, "0", width)
    try:
        assert cached.concurrency == (width or DEFAULT_BATCH_WIDTH)
        assert cached.prefixes is not None and baseline.prefixes is not None
        histories: list[list[ChatMessage]] = [[] for _ in OPENERS]
        hits: list[list[int]] = [[] for _ in OPENERS]
        for turn in range(6):
            for c, opener in enumerate(OPENERS):
                history = histories[c]
                history.append(ChatMessage(role="user", content=opener if turn == 0 else FOLLOW_UPS[turn - 1]))
                got = run(cached, list(history))
                baseline.prefixes.forget_hot()  # the baseline evaluates every request afresh
                want = run(baseline, list(history))
                assert want[-1].usage.cached_tokens == 0
                assert [t.token_id for t in got] == [t.token_id for t in want], (c, turn)
                hits[c].append(got[-1].usage.cached_tokens)
                history.append(ChatMessage(role="assistant", content="".join(t.text for t in got)))
        for c in range(len(OPENERS)):
            assert all(h > 0 for h in hits[c][1:]), hits
        stats = cached.prefixes.stats
        assert stats.restores >= 5 * len(OPENERS) - 1 and stats.cold_hit_tokens > 0
        assert 0 < stats.cold_bytes <= 64 * 1024 * 1024
    finally:
        cached.close()
        baseline.close()


def test_a_request_joining_a_busy_batch_starts_from_its_cached_prefix(tiny_hf, monkeypatch) -> None:
    """Turn 2 of a conversation joins while another request is mid-decode: the two share the
    batch's steps, and turn 2 evaluates only what its cached turn 1 does not hold, decoding
    exactly what an uncached engine does."""
    cached = load(tiny_hf, "64")
    baseline = load(tiny_hf, "0")
    try:
        history = [ChatMessage(role="user", content=OPENERS[0])]
        turn_1 = run(cached, history)
        history += [ChatMessage(role="assistant", content="".join(t.text for t in turn_1)),
                    ChatMessage(role="user", content=FOLLOW_UPS[0])]
        # A prompt the tiny model never ends early: the other request runs to its max_tokens.
        other = TextGenerationParams(model_id=MODEL, prompt="It rained again on Thursday and the", temperature=0,
                                     max_tokens=24)
        other_alone = [t.token_id for t in baseline.generate(other, threading.Event())]
        assert len(other_alone) == 24
        assert cached.prefixes is not None
        restores = cached.prefixes.stats.restores

        # Once the other request has decoded its first token (one pass of the loop), the loop
        # takes no further step until turn 2 joins (without this a fast machine could finish
        # it first): no timing decides whether the two share the batch.
        loop = cached._batch
        assert loop is not None
        take = loop._take_commands
        other_started = threading.Event()
        passes_alone: list[int] = []
        shared_at_join: list[int] = []

        def hold_until_turn_2_joins(generator, block: bool) -> None:
            take(generator, block)
            if shared_at_join or not loop._active:
                return
            if len(loop._active) == 1:
                passes_alone.append(1)
                while len(passes_alone) >= 2 and len(loop._active) == 1:
                    take(generator, True)  # waits for turn 2 to join
            if len(loop._active) > 1 or len(passes_alone) >= 2:
                shared_at_join.append(len(loop._active))

        monkeypatch.setattr(loop, "_take_commands", hold_until_turn_2_joins)
        other_tokens: list[int | None] = []

        def run_other() -> None:
            for token in cached.generate(other, threading.Event()):
                other_tokens.append(token.token_id)
                other_started.set()

        thread = threading.Thread(target=run_other)
        thread.start()
        assert other_started.wait(60)
        turn_2 = run(cached, list(history))
        thread.join(60)

        baseline_turn_2 = run(baseline, list(history))
        assert shared_at_join == [2]  # turn 2 joined while the other request was in the batch
        usage, baseline_usage = turn_2[-1].usage, baseline_turn_2[-1].usage
        assert usage is not None and baseline_usage is not None
        assert usage.cached_tokens > 0 and baseline_usage.cached_tokens == 0
        assert cached.prefixes.stats.restores == restores + 1
        assert [t.token_id for t in turn_2] == [t.token_id for t in baseline_turn_2]
        assert other_tokens == other_alone  # its neighbour's prefix changed nothing for it
    finally:
        cached.close()
        baseline.close()
