"""llama.cpp engine features beyond plain text: embeddings, logprobs, tool rendering. Runs
against the generated tiny GGUF model."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from skulk.shared.types.common import ChatMessage, ToolCall, ToolSpec
from skulk.shared.types.ids import ModelId
from skulk.shared.types.tasks import TextGenerationParams
from skulk.worker.engines.base import GeneratedToken, PromptTooLong
from skulk.worker.engines.llama_cpp.engine import (
    InvalidDimensions,
    ScoredToken,
    log_softmax_at,
    normalise,
)
from tests.worker.engines.test_llama_cpp import PROMPT, load_engine
from tests.worker.tiny_gguf import TINY_GGUF_MODEL_ID, prompt_params, tiny_gguf  # noqa: F401

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def engine(tiny_gguf):
    engine = load_engine(tiny_gguf)
    engine.warm_up()
    yield engine
    engine.close()


def run(engine, params):
    return list(engine.generate(params, threading.Event()))


# -- pure helpers ---------------------------------------------------------------------


@pytest.mark.parametrize("top", [0, 1, 3])
def test_log_softmax_matches_the_definition(top):
    logits = np.array([1.0, 3.0, -2.0, 0.5], dtype=np.float32)
    expected = logits - math.log(sum(math.exp(x) for x in logits))
    chosen, best = log_softmax_at(logits, 2, top)
    assert chosen == pytest.approx(expected[2], abs=1e-5)
    assert [i for i, _ in best] == [1, 0, 3][:top]
    assert [lp for _, lp in best] == pytest.approx([expected[i] for i in [1, 0, 3][:top]], abs=1e-5)


@pytest.mark.parametrize(
    ("vector", "dimensions", "expected"),
    [
        ([3.0, 4.0], None, [0.6, 0.8]),
        ([3.0, 4.0, 12.0], 2, [0.6, 0.8]),
        ([0.0, 0.0], None, [0.0, 0.0]),
    ],
)
def test_normalise(vector, dimensions, expected):
    assert normalise(np.array(vector), dimensions) == pytest.approx(expected)


def test_normalise_refuses_more_dimensions_than_the_model_has():
    with pytest.raises(InvalidDimensions):
        normalise(np.array([1.0, 2.0]), 3)


# -- embeddings -----------------------------------------------------------------------


def test_embeddings_are_unit_length_deterministic_and_distinct(engine):
    vectors, tokens = engine.embed(["hello world", "a sentence about cats", "hello world"])
    assert len(vectors) == 3 and tokens > 0
    width = len(vectors[0])
    assert width == engine.llama.n_embd()
    for vector in vectors:
        assert len(vector) == width and math.isclose(float(np.linalg.norm(vector)), 1.0, rel_tol=1e-6)
    assert vectors[0] == pytest.approx(vectors[2], abs=1e-6)
    assert float(np.dot(vectors[0], vectors[1])) < 0.999


def test_embedding_does_not_depend_on_what_ran_before(engine):
    (before,), _ = engine.embed(["the same text"])
    run(engine, prompt_params(PROMPT, temperature=0, max_tokens=5))
    engine.embed(["something else first"])
    (after,), _ = engine.embed(["the same text"])
    assert before == pytest.approx(after, abs=1e-6)


def test_generation_after_embedding_is_unchanged(engine):
    params = prompt_params(PROMPT, temperature=0, max_tokens=8)
    reference = [t.token_id for t in run(engine, params)]
    engine.embed(["interleaved embedding"])
    assert [t.token_id for t in run(engine, params)] == reference


def test_embedding_dimensions_truncate_and_renormalise(engine):
    (full,), _ = engine.embed(["hello world"])
    (short,), _ = engine.embed(["hello world"], dimensions=16)
    assert len(short) == 16
    assert math.isclose(float(np.linalg.norm(short)), 1.0, rel_tol=1e-6)
    expected = np.array(full[:16]) / np.linalg.norm(full[:16])
    assert short == pytest.approx(expected.tolist(), abs=1e-6)


def test_embedding_longer_than_a_batch_and_too_long_for_the_context(engine):
    text = "the " * 700  # > n_batch (512) tokens, < the 2048 context
    vectors, tokens = engine.embed([text])
    assert tokens > engine.llama.n_batch and len(vectors[0]) == engine.llama.n_embd()
    with pytest.raises(PromptTooLong):
        engine.embed(["the " * 3000])
    assert engine.in_flight == 0


# -- logprobs -------------------------------------------------------------------------


def test_without_logprobs_tokens_are_plain(engine):
    tokens = run(engine, prompt_params(PROMPT, temperature=0, max_tokens=3))
    assert all(type(t) is GeneratedToken for t in tokens)


def test_greedy_logprobs_name_the_sampled_token_as_most_likely(engine):
    plain = run(engine, prompt_params(PROMPT, temperature=0, max_tokens=6))
    scored = run(engine, prompt_params(PROMPT, temperature=0, max_tokens=6, logprobs=True, top_logprobs=3))
    assert [t.token_id for t in scored] == [t.token_id for t in plain]  # logprobs change nothing sampled
    for token in scored:
        assert isinstance(token, ScoredToken)
        assert token.logprob is not None and token.logprob <= 0
        assert len(token.top_logprobs) == 3
        assert token.top_logprobs[0].token_id == token.token_id
        assert token.top_logprobs[0].logprob == pytest.approx(token.logprob)
        assert [t.logprob for t in token.top_logprobs] == sorted((t.logprob for t in token.top_logprobs), reverse=True)
    assert scored[-1].finish_reason == "length"


def test_logprobs_without_top_alternatives(engine):
    scored = run(engine, prompt_params(PROMPT, temperature=0, max_tokens=2, logprobs=True))
    assert all(t.top_logprobs == [] and t.logprob <= 0 for t in scored)


# -- tools through the chat template --------------------------------------------------


def test_tools_and_tool_turns_render_through_the_chat_template(engine):
    params = TextGenerationParams(
        model_id=ModelId(TINY_GGUF_MODEL_ID),
        messages=[
            ChatMessage(role="user", content="Weather in Paris?"),
            ChatMessage(role="assistant", tool_calls=[ToolCall(id="call_1", name="get_weather",
                                                               arguments='{"city": "Paris"}')]),
            ChatMessage(role="tool", content="sunny, 21C", tool_call_id="call_1"),
        ],
        tools=[ToolSpec(name="get_weather", description="Current weather for a city",
                        parameters={"type": "object", "properties": {"city": {"type": "string"}}})],
        max_tokens=4, temperature=0,
    )
    rendered = engine.render_chat(params)
    assert "sunny, 21C" in rendered
    tokens = run(engine, params)
    assert tokens[-1].finish_reason == "length"


# -- a template that opens the think block ---------------------------------------------


@pytest.mark.parametrize(
    ("rendered", "opens"),
    [("...<|Assistant|><think>\n", True), ("<|assistant|>\n", False), ("<think>x</think>\n", False), ("", False)],
)
def test_opens_reasoning(rendered, opens):
    from skulk.worker.engines.llama_cpp.engine import opens_reasoning

    assert opens_reasoning(rendered) is opens


def test_output_of_a_template_opened_think_block_starts_with_the_tag(engine, monkeypatch):
    params = TextGenerationParams(model_id=ModelId(TINY_GGUF_MODEL_ID), messages=[ChatMessage(role="user", content="hi")],
                                  max_tokens=3, temperature=0)
    plain = run(engine, params)
    render = engine._render
    monkeypatch.setattr(engine, "_render", lambda messages, tools, switches=None: render(messages, tools) + "<think>\n")
    tokens = run(engine, params)
    assert tokens[0].text == "<think>" and tokens[0].token_id is None
    assert len(tokens) == 4 and tokens[-1].usage.completion_tokens == 3
    # Raw prompts never get it: the caller wrote the prompt and reads the output raw.
    raw = run(engine, prompt_params("x<think>", temperature=0, max_tokens=2))
    assert raw[0].token_id is not None
    assert len(plain) == 3


def test_a_continued_turn_goes_on_where_the_output_was_cut(engine, monkeypatch):
    """`continue_from` (a spent thinking budget's continuation) writes the model's own output
    after the generation prompt: the prompt is the first run's prompt plus the tokens it
    generated, so greedy decoding goes on exactly as the uninterrupted run did; the `<think>`
    the template opened is not written twice, and the closing marker follows the thought."""
    render = engine._render
    monkeypatch.setattr(engine, "_render", lambda messages, tools, switches=None: render(messages, tools) + "<think>\n")
    params = TextGenerationParams(model_id=ModelId(TINY_GGUF_MODEL_ID), messages=[ChatMessage(role="user", content="hi")],
                                  max_tokens=24, temperature=0)
    whole = run(engine, params)
    assert whole[0].text == "<think>" and len(whole) == 25
    head, tail = whole[:13], whole[13:]
    thought = "".join(t.text for t in head)
    more = params.model_copy(update={"continue_from": thought, "max_tokens": 12})
    assert engine.prompt_tokens(more) == engine.prompt_tokens(params) + [t.token_id for t in head[1:]]
    rest = run(engine, more)
    assert [t.token_id for t in rest] == [t.token_id for t in tail]
    assert rest[0].prompt_tokens == len(engine.prompt_tokens(more))  # no second think-open token
    closed = params.model_copy(update={"continue_from": thought + "\n</think>\n\n"})
    text, _ = engine.prompt_and_tokens(closed)
    assert text == engine.render_chat(params) + thought.removeprefix("<think>") + "\n</think>\n\n"


def test_the_first_token_says_the_prompt_length_and_a_matched_stop_says_which(engine):
    free = run(engine, prompt_params(PROMPT, temperature=0, max_tokens=12))
    assert free[0].prompt_tokens == free[-1].usage.prompt_tokens and all(t.prompt_tokens is None for t in free[1:])
    text = "".join(t.text for t in free)
    stop = text[4:7]  # a string the greedy output is known to contain
    stopped = run(engine, prompt_params(PROMPT, temperature=0, max_tokens=12, stop=["zzz", stop]))
    assert stopped[-1].finish_reason == "stop" and stopped[-1].stop_sequence == stop
    assert free[-1].stop_sequence is None


def test_a_count_only_request_counts_the_prompt_and_generates_nothing(engine):
    from skulk.worker.engines.base import Dispatcher, GenerationResult

    seen: list = []

    class Sink:
        def on_start(self, request_id): pass
        def on_token(self, request_id, token): seen.append(token)
        def on_finish(self, request_id, result: GenerationResult): seen.append(result)

    dispatcher = Dispatcher(engine, Sink(), width=1, engine_name="llama_cpp")
    try:
        params = prompt_params(PROMPT, count_only=True)
        dispatcher.submit("count", params)
        deadline = threading.Event()
        for _ in range(200):
            if len(seen) == 2:
                break
            deadline.wait(0.05)
    finally:
        dispatcher.close(timeout_s=5)
    token, result = seen
    assert result.outcome == "completed" and token.text == ""
    assert token.usage.prompt_tokens == len(engine.prompt_tokens(params)) and token.usage.completion_tokens == 0


def test_a_per_request_context_is_honoured(engine):
    n_prompt = len(engine.prompt_tokens(prompt_params(PROMPT)))
    tokens = run(engine, prompt_params(PROMPT, temperature=0, context_tokens=n_prompt + 3))
    assert tokens[-1].finish_reason == "length" and tokens[-1].usage.completion_tokens == 3
    with pytest.raises(PromptTooLong) as caught:
        run(engine, prompt_params(PROMPT, context_tokens=n_prompt))
    assert caught.value.context_tokens == n_prompt


SWITCHED_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% if reasoning_effort is defined %}[effort={{ reasoning_effort }}]{% endif %}"
)


@pytest.mark.parametrize(("switches", "fields", "tail"), [
    (("enable_thinking",), {"thinking": False}, "<|assistant|><think></think>"),
    (("enable_thinking",), {}, "<|assistant|>"),
    (("reasoning_effort",), {"reasoning_effort": "low"}, "<|assistant|>[effort=low]"),
    ((), {"thinking": False}, "<|assistant|>"),  # no switch: the API refuses; nothing reaches the template
])
def test_the_chat_template_gets_the_cards_reasoning_switches(switches, fields, tail):
    """llama-cpp-python's own Jinja formatter renders the template with the request's switch."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from skulk.shared.types.common import ChatMessage
    from skulk.shared.types.tasks import TextGenerationParams
    from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine

    engine = LlamaCppEngine()
    engine._formatter = Jinja2ChatFormatter(template=SWITCHED_TEMPLATE, eos_token="", bos_token="")
    engine._reasoning_switches = switches  # what load() takes from the card
    request = TextGenerationParams(model_id="local/x", messages=[ChatMessage(role="user", content="hi")], **fields)
    assert engine.render_chat(request) == "<|user|>hi" + tail


def test_reasoning_sent_back_is_rendered_as_caller_text():
    """An assistant turn's reasoning (Anthropic thinking blocks, OpenAI reasoning_content)
    reaches a template that reads it, and is caller text: special-token text in it is never
    parsed as a special token."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from skulk.shared.types.common import ChatMessage
    from skulk.shared.types.tasks import TextGenerationParams
    from skulk.worker.engines.llama_cpp.engine import LlamaCppEngine

    template = ("{% for m in messages %}<|{{ m.role }}|>{% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
                "</think>{% endif %}{{ m.content }}{% endfor %}<|assistant|>")
    engine = LlamaCppEngine()
    engine._formatter = Jinja2ChatFormatter(template=template, eos_token="", bos_token="")
    request = TextGenerationParams(model_id="local/x", messages=[
        ChatMessage(role="user", content="hi"),
        ChatMessage(role="assistant", content="Paris.", reasoning_content="why <|eot_id|>"),
        ChatMessage(role="user", content="more")])
    rendered, segments = engine._chat_segments(request)
    assert "<think>why <|eot_id|></think>Paris." in rendered
    assert [s.text for s in segments if not s.trusted] == ["hi", "why <|eot_id|>", "Paris.", "more"]
