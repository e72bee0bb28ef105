"""The llama.cpp engine's prefix cache on the tiny GGUF: interleaved conversations re-use
their own KV (hot or restored from the cold store) and still produce exactly the tokens of
fresh, uncached requests."""

from __future__ import annotations

import threading

import pytest

from skulk.shared.prefix_cache import COLD_BUDGET_ENV
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import GeneratedToken
from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine
from tests.worker.engines.test_llama_cpp import load_engine
from tests.worker.tiny_gguf import TINY_GGUF_MODEL_ID, tiny_gguf  # noqa: F401  (fixture)

pytestmark = pytest.mark.timeout(300)

OPENERS = [
    "Tell me about the sea and the ships that sail on it.",
    "What is the best way to grow tomatoes in a small garden?",
    "Explain how a steam engine turns heat into motion.",
]
FOLLOW_UPS = ["Go on.", "Why is that?", "Give an example.", "And then what?", "Summarise that."]


def chat(messages: list[ChatMessage]) -> TextGenerationParams:
    return TextGenerationParams(
        model_id=ModelId(TINY_GGUF_MODEL_ID), messages=messages, temperature=0, max_tokens=12
    )


def run(engine: LlamaCppEngine, params: TextGenerationParams) -> list[GeneratedToken]:
    return list(engine.generate(params, threading.Event()))


def fresh(engine: LlamaCppEngine, params: TextGenerationParams) -> list[GeneratedToken]:
    """The request evaluated from an empty context: no prefix of anything re-used."""
    engine._clear_context(engine.llama)
    tokens = run(engine, params)
    assert tokens[-1].usage is not None and tokens[-1].usage.cached_tokens == 0
    return tokens


@pytest.fixture(scope="module")
def engines(tiny_gguf, monkeypatch_module):
    monkeypatch_module.setenv(COLD_BUDGET_ENV, "64")
    cached = load_engine(tiny_gguf)
    monkeypatch_module.setenv(COLD_BUDGET_ENV, "0")
    baseline = load_engine(tiny_gguf)
    yield cached, baseline
    cached.close()
    baseline.close()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_interleaved_conversations_match_fresh_requests_and_hit_the_cache(engines) -> None:
    cached, baseline = engines
    histories: list[list[ChatMessage]] = [[] for _ in OPENERS]
    hits: list[list[int]] = [[] for _ in OPENERS]
    for turn in range(6):
        for c, opener in enumerate(OPENERS):
            history = histories[c]
            history.append(ChatMessage(role="user", content=opener if turn == 0 else FOLLOW_UPS[turn - 1]))
            params = chat(list(history))
            got = run(cached, params)
            want = fresh(baseline, params)
            assert [t.token_id for t in got] == [t.token_id for t in want], (c, turn)
            usage = got[-1].usage
            assert usage is not None and usage.prompt_tokens == want[-1].usage.prompt_tokens
            hits[c].append(usage.cached_tokens)
            history.append(ChatMessage(role="assistant", content="".join(t.text for t in got)))
    # Every later turn re-used the conversation's earlier KV although two other
    # conversations ran in between: restored from the cold store, not recomputed.
    for c in range(len(OPENERS)):
        assert all(h > 0 for h in hits[c][1:]), hits
    stats = cached.prefixes.stats
    assert stats.restores >= 5 * len(OPENERS) - 1
    assert stats.cold_hit_tokens > 0 and stats.saves > 0
    assert 0 < stats.cold_bytes <= 64 * 1024 * 1024


def test_a_cold_store_over_budget_evicts_and_stays_correct(tiny_gguf, monkeypatch) -> None:
    # A budget for about one conversation: entries are evicted, answers stay exact.
    probe = load_engine(tiny_gguf)
    try:
        params = chat([ChatMessage(role="user", content=OPENERS[0])])
        run(probe, params)
        import llama_cpp

        one = llama_cpp.llama_state_seq_get_size(probe.llama._ctx.ctx, 0)
    finally:
        probe.close()
    monkeypatch.setenv(COLD_BUDGET_ENV, str((one * 1.5) / (1024 * 1024)))
    engine = load_engine(tiny_gguf)
    try:
        outputs = {}
        for round_ in range(2):
            for c, opener in enumerate(OPENERS):
                params = chat([ChatMessage(role="user", content=opener)])
                ids = [t.token_id for t in run(engine, params)]
                assert outputs.setdefault(c, ids) == ids, (round_, c)
        stats = engine.prefixes.stats
        assert stats.evictions > 0
        assert stats.cold_bytes <= engine.prefixes.budget_bytes
    finally:
        engine.close()
