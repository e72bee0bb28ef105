"""The in-process llama.cpp engine against the generated tiny GGUF model."""

from __future__ import annotations

import threading

import pytest

from skulk.shared.types.common import ChatMessage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import (
    ChatTemplateMissing,
    EngineNotLoaded,
    GeneratedToken,
    ModelLoadFailed,
    PromptTooLong,
    ShardSpec,
)
from skulk.worker.engines.llama_cpp.engine import (
    FLASH_ATTN_ENV,
    LlamaCppEngine,
    flash_attn_enabled,
    gpu_layers_for,
)
from tests.worker.tiny_gguf import (
    LONG_PROMPT,
    LONG_TOKENS,
    RUNNER,
    TINY_GGUF_MODEL_ID,
    prompt_params,
    tiny_gguf,  # noqa: F401  (fixture)
    tiny_gguf_card,
    tiny_instance,
)

pytestmark = pytest.mark.timeout(120)

PROMPT = "The weather today is"


def load_engine(gguf_path, *, context_token_limit: int = 2048, kv_cache_type: str = "f16") -> LlamaCppEngine:
    card = tiny_gguf_card()
    engine = LlamaCppEngine()
    instance = tiny_instance(card, context_token_limit=context_token_limit)
    shards = [s.model_copy(update={"kv_cache_type": kv_cache_type}) for s in instance.shards]
    engine.load(
        ShardSpec(
            instance=instance.model_copy(update={"shards": shards}),
            runner_id=RUNNER,
            card=card,
            model_path=str(gguf_path),
            n_threads=1,
        )
    )
    return engine


@pytest.fixture(scope="module")
def engine(tiny_gguf):
    engine = load_engine(tiny_gguf)
    engine.warm_up()
    yield engine
    engine.close()


def run(
    engine: LlamaCppEngine, params: TextGenerationParams, cancelled: threading.Event | None = None
) -> list[GeneratedToken]:
    return list(engine.generate(params, cancelled or threading.Event()))


def text_of(tokens: list[GeneratedToken]) -> str:
    return "".join(t.text for t in tokens)


def test_greedy_generation_is_deterministic(engine) -> None:
    params = prompt_params(PROMPT, temperature=0, max_tokens=24)
    first = run(engine, params)
    run(engine, prompt_params("Something else entirely", temperature=0, max_tokens=5))  # disturb the KV cache
    second = run(engine, params)
    assert [t.token_id for t in first] == [t.token_id for t in second]
    assert text_of(first) == text_of(second)
    assert text_of(first).strip()  # the tiny model does emit text


def test_long_prompt_really_is_long(engine) -> None:
    # The runner tests cancel and kill generations of this prompt mid-stream; if the model
    # ended it early on its own, those tests would race the end instead.
    tokens = run(engine, prompt_params(LONG_PROMPT, temperature=0, max_tokens=LONG_TOKENS))
    assert (len(tokens), tokens[-1].finish_reason) == (LONG_TOKENS, "length")


def test_seeded_sampling_is_reproducible(engine) -> None:
    params = prompt_params(PROMPT, temperature=1.0, top_k=0, top_p=1.0, seed=1234, max_tokens=16)
    assert [t.token_id for t in run(engine, params)] == [t.token_id for t in run(engine, params)]


def test_max_tokens_ends_with_length_and_exact_usage(engine) -> None:
    params = prompt_params(PROMPT, temperature=0, max_tokens=7)
    tokens = run(engine, params)
    assert len(tokens) == 7
    assert all(t.finish_reason is None and t.usage is None for t in tokens[:-1])
    last = tokens[-1]
    assert last.finish_reason == "length"
    prompt_tokens = len(engine.prompt_tokens(params))
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (
        prompt_tokens, 7, prompt_tokens + 7
    )
    assert all(isinstance(t.token_id, int) for t in tokens)


def test_stop_string_is_trimmed_and_ends_with_stop(engine) -> None:
    full = text_of(run(engine, prompt_params(PROMPT, temperature=0, max_tokens=40)))
    stop = full[12:16]
    assert len(stop) == 4 and stop.strip(), full
    expected = full[: full.index(stop)]

    tokens = run(engine, prompt_params(PROMPT, temperature=0, max_tokens=40, stop=[stop]))
    assert text_of(tokens) == expected
    assert stop not in text_of(tokens)
    assert tokens[-1].finish_reason == "stop"
    assert tokens[-1].usage is not None and tokens[-1].usage.completion_tokens == len(tokens) < 40


def test_end_of_generation_token_ends_with_stop(engine, monkeypatch) -> None:
    reference = run(engine, prompt_params(PROMPT, temperature=0, max_tokens=10))
    eog = reference[5].token_id
    first = next(i for i, t in enumerate(reference) if t.token_id == eog)
    # Stand-in for the model choosing <|eot_id|>: a random model rarely does on cue.
    monkeypatch.setattr(engine, "_is_end_of_generation", lambda token: token == eog)

    tokens = run(engine, prompt_params(PROMPT, temperature=0, max_tokens=10))
    assert len(tokens) == first + 1
    assert tokens[-1].token_id == eog and tokens[-1].finish_reason == "stop"
    assert tokens[-1].text == ""  # the end token itself is never text
    assert text_of(tokens) == text_of(reference[:first])


def test_cancellation_stops_mid_stream(engine) -> None:
    cancelled = threading.Event()
    received: list[GeneratedToken] = []
    for token in engine.generate(prompt_params(LONG_PROMPT, temperature=0, max_tokens=500), cancelled):
        received.append(token)
        if len(received) == 3:
            cancelled.set()
    assert len(received) == 3
    assert all(t.finish_reason is None for t in received)
    assert engine.in_flight == 0
    # The engine is free again at once.
    assert run(engine, prompt_params(PROMPT, temperature=0, max_tokens=2))[-1].finish_reason == "length"


def test_chat_messages_use_the_gguf_chat_template(engine) -> None:
    params = TextGenerationParams(
        model_id=ModelId(TINY_GGUF_MODEL_ID),
        messages=[
            ChatMessage(role="system", content="Be brief."),
            ChatMessage(role="user", content="Hello there"),
        ],
        temperature=0,
        max_tokens=12,
    )
    rendered = engine.render_chat(params)
    assert rendered == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    llama = engine.llama
    tokens = engine.prompt_tokens(params)
    assert tokens[0] == llama.token_bos() and tokens.count(llama.token_bos()) == 1
    header = llama.tokenize(b"<|start_header_id|>", add_bos=False, special=True)
    assert len(header) == 1 and tokens.count(header[0]) == 3  # special tokens, not their text

    chat = run(engine, params)
    raw = run(engine, prompt_params(rendered, temperature=0, max_tokens=12))
    assert [t.token_id for t in chat] == [t.token_id for t in raw]
    assert chat[-1].usage is not None and chat[-1].usage.prompt_tokens == len(tokens)


def test_context_exhaustion_ends_with_length_and_long_prompts_are_refused(tiny_gguf) -> None:
    small = load_engine(tiny_gguf, context_token_limit=32)
    try:
        assert small.context_tokens == 32
        params = prompt_params(PROMPT, temperature=0)
        prompt_tokens = len(small.prompt_tokens(params))
        tokens = run(small, params)
        assert tokens[-1].finish_reason == "length"
        assert tokens[-1].usage is not None
        assert tokens[-1].usage.completion_tokens == 32 - prompt_tokens == len(tokens)

        with pytest.raises(PromptTooLong) as too_long:
            run(small, prompt_params("word " * 64, temperature=0))
        assert too_long.value.context_tokens == 32
        assert too_long.value.error_type == "ContextLengthExceeded"
    finally:
        small.close()


def test_context_is_capped_by_the_models_trained_context(tiny_gguf) -> None:
    big = load_engine(tiny_gguf, context_token_limit=100_000)
    try:
        assert big.context_tokens == tiny_gguf_card().context_length == 2048
    finally:
        big.close()


def test_load_failures_are_typed(tmp_path) -> None:
    card = tiny_gguf_card()
    engine = LlamaCppEngine()
    with pytest.raises(ModelLoadFailed):
        engine.load(ShardSpec(tiny_instance(card), RUNNER, card, str(tmp_path / "missing.gguf")))
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadFailed):
        engine.load(ShardSpec(tiny_instance(card), RUNNER, card, str(garbage)))
    with pytest.raises(EngineNotLoaded):
        run(engine, prompt_params(PROMPT))


def test_messages_without_a_chat_template_fail_clearly(engine, monkeypatch) -> None:
    monkeypatch.setattr(engine, "_formatter", None)
    params = TextGenerationParams(
        model_id=ModelId(TINY_GGUF_MODEL_ID), messages=[ChatMessage(role="user", content="hi")]
    )
    with pytest.raises(ChatTemplateMissing):
        run(engine, params)


@pytest.mark.parametrize(
    ("pin", "env", "kv_type", "enabled"),
    [
        (None, {}, "f16", True),
        (None, {FLASH_ATTN_ENV: "0"}, "f16", False),
        (None, {FLASH_ATTN_ENV: "1"}, "f16", True),
        (True, {FLASH_ATTN_ENV: "0"}, "f16", True),
        (False, {}, "f16", False),
        # a quantized V cache needs flash attention: it beats the node setting
        (None, {FLASH_ATTN_ENV: "0"}, "q8_0", True),
    ],
)
def test_flash_attention_setting(pin, env, kv_type, enabled) -> None:
    assert flash_attn_enabled(pin, env, kv_type) is enabled


@pytest.mark.parametrize(
    ("tag", "layers"),
    [("llama_cpp-cpu", 0), ("llama_cpp-cuda", -1), ("llama_cpp", -1), ("llama_cpp-metal", -1)],
)
def test_gpu_offload_follows_the_backend_tag(tag, layers) -> None:
    assert gpu_layers_for(tag) == layers


def test_the_placements_kv_cache_type_reaches_llama_cpp(tiny_gguf):
    """The shard's KV cache type is the context's: the same tokens evaluated take the bytes
    of their type in llama.cpp's own state (q8_0: 34 bytes per 32 elements, f16: 64), and
    greedy decoding still runs."""
    import llama_cpp

    sizes = {}
    for kv_type in ("f16", "q8_0", "q4_0"):
        engine = load_engine(tiny_gguf, kv_cache_type=kv_type)
        try:
            llama = engine._llama
            assert (llama.context_params.type_k, llama.context_params.type_v) == (
                getattr(llama_cpp, f"GGML_TYPE_{kv_type.upper()}"),) * 2
            tokens = list(engine.generate(prompt_params(LONG_PROMPT, temperature=0, max_tokens=64), threading.Event()))
            assert tokens[-1].usage.completion_tokens == 64
            sizes[kv_type] = llama_cpp.llama_state_seq_get_size(llama._ctx.ctx, 0)
        finally:
            engine.close()
    assert sizes["q8_0"] < sizes["f16"] * 0.6 and sizes["q4_0"] < sizes["q8_0"] * 0.6, sizes
