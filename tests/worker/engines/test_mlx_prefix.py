"""The MLX engine's prefix cache on the generated tiny Llama (mlx on the CPU): interleaved
conversations re-use their own KV, hot or restored from the cold store, and produce exactly
the tokens of fresh, uncached requests."""

from __future__ import annotations

import threading

import pytest

from skulk.shared.prefix_cache import COLD_BUDGET_ENV
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.mlx.engine import MlxEngine
from tests.worker.engines.mlx_ranks import local_instance
from tests.worker.engines.test_llama_cpp_prefix import FOLLOW_UPS, OPENERS
from tests.worker.engines.test_mlx_engine import CARD, MODEL, spec_for, tiny_hf  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(300)


def load(path, budget_mb: str) -> MlxEngine:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(COLD_BUDGET_ENV, budget_mb)
        engine = MlxEngine()
        engine.load(spec_for(local_instance(CARD, 1), path))
    return engine


def run(engine: MlxEngine, messages: list[ChatMessage]):
    params = TextGenerationParams(model_id=MODEL, messages=messages, temperature=0, max_tokens=10)
    return list(engine.generate(params, threading.Event()))


def test_interleaved_conversations_match_fresh_requests_and_hit_the_cache(tiny_hf) -> None:
    cached = load(tiny_hf, "64")
    baseline = load(tiny_hf, "0")
    try:
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
