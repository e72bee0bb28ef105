"""gpt-oss's harmony channels: the incremental splitter (any cut of the text gives the same
reasoning and answer, markers never leak) and the four APIs answering a harmony card's model
with its reasoning apart from its answer."""

from __future__ import annotations

import pytest

from skulk.api.harmony import HarmonySplitter
from skulk.api.output import splitter_for
from skulk.api.reasoning import ReasoningSplitter
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.cards import ReasoningSection
from tests.api.scripted_cluster import scripted_app
from tests.api.test_openai_routes import MODEL
from tests.api.test_tools_sdk import anthropic_sdk, ollama_sdk, openai_sdk


def run(pieces: list[str]) -> tuple[str, str]:
    splitter = HarmonySplitter()
    out = [p for piece in pieces for p in splitter.push(piece)] + splitter.flush()
    return "".join(t for t, r in out if r), "".join(t for t, r in out if not r)


FULL = ("<|channel|>analysis<|message|>User asks capital. Easy.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Paris.<|return|>")
CASES = [
    # (full text, reasoning, answer)
    (FULL, "User asks capital. Easy.", "Paris."),
    # an engine that stops on <|return|> without emitting it
    (FULL.removesuffix("<|return|>"), "User asks capital. Easy.", "Paris."),
    ("Plain answer, no channels.", "", "Plain answer, no channels."),
    ("<|channel|>analysis<|message|>still thinking", "still thinking", ""),
    # a message to a function is a call, wrapped for the tool parser; commentary is answer text
    ("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\":1}<|call|>", "",
     "<function=f>{\"a\":1}</function>"),
    ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather"
     "<|channel|>commentary json<|message|>{\"city\":\"Paris\"}<|call|>", "Need weather.",
     "<function=get_weather>{\"city\":\"Paris\"}</function>"),
    ("<|channel|>commentary<|message|>Let me check.<|end|>", "", "Let me check."),
    # prose with '<' and '<|' that are no markers stays
    ("<|channel|>final<|message|>a < b and x<|y", "", "a < b and x<|y"),
    ("", "", ""),
]


@pytest.mark.parametrize(("text", "reasoning", "answer"), CASES)
def test_whole_text(text, reasoning, answer):
    assert run([text]) == (reasoning, answer)


@pytest.mark.parametrize(("text", "reasoning", "answer"), CASES)
def test_one_character_at_a_time(text, reasoning, answer):
    assert run(list(text)) == (reasoning, answer)


@pytest.mark.parametrize(("text", "reasoning", "answer"), CASES)
def test_every_two_way_cut(text, reasoning, answer):
    for cut in range(len(text) + 1):
        assert run([text[:cut], text[cut:]]) == (reasoning, answer), cut


def test_an_unclosed_marker_is_held_only_so_long():
    splitter = HarmonySplitter()
    assert splitter.push("x<|") == [("x", False)]
    assert splitter.push("not a marker at all, just text") == [("<|not a marker at all, just text", False)]


@pytest.mark.parametrize(("section", "kind", "tags"), [
    (None, ReasoningSplitter, ("<think>", "</think>")),
    (ReasoningSection(format="harmony"), HarmonySplitter, None),
    (ReasoningSection(format="think_tags", start_tag="<reasoning>", end_tag="</reasoning>"), ReasoningSplitter,
     ("<reasoning>", "</reasoning>")),
])
def test_the_cards_format_picks_the_splitter(section, kind, tags):
    splitter = splitter_for(section)
    assert isinstance(splitter, kind)
    if tags is not None:
        pieces = splitter.push(f"{tags[0]}why{tags[1]}ok") + splitter.flush()
        assert pieces == [("why", True), ("ok", False)]


def harmony_app(pieces: list[str]):
    from skulk.shared.types.cards import ToolingSection

    card = load_card(builtin_cards_dir() / "local--tiny-llama.toml")
    card = card.model_copy(update={"reasoning": ReasoningSection(format="harmony"),
                                   "tooling": ToolingSection(tool_call_format="harmony"),
                                   "capabilities": (*card.capabilities, "thinking", "tools")})
    return scripted_app(pieces, context_fields={"get_cards": lambda: {MODEL: card}})


SCRIPT = ["<|channel|>", "analysis", "<|message|>", "Capital", " of France.", "<|end|>", "<|start|>",
          "assistant", "<|channel|>", "final", "<|message|>", "Paris", "."]


async def test_openai_chat_splits_harmony():
    app, _ = harmony_app(SCRIPT)
    reply = await openai_sdk(app).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "?"}])
    message = reply.choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == ("Capital of France.", "Paris.")
    app, _ = harmony_app(SCRIPT)
    stream = await openai_sdk(app).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "?"}], stream=True)
    content = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert "".join(content) == "Paris."


async def test_responses_answer_has_no_channels_and_reasoning_is_its_own_item():
    from tests.api.test_responses_spec import valid

    app, cluster = harmony_app(SCRIPT)
    client = openai_sdk(app)
    reply = await client.responses.create(model=MODEL, input="?")
    assert reply.output_text == "Paris."
    assert [item.type for item in reply.output] == ["reasoning", "message"]
    assert [c.text for c in reply.output[0].content] == ["Capital of France."] and reply.output[0].summary == []
    assert reply.usage.output_tokens_details.reasoning_tokens > 0
    valid(reply.model_dump(mode="json"))

    # Sending the output back (the SDK's way of keeping context) gives the turn its reasoning,
    # and so does continuing the stored response.
    await client.responses.create(model=MODEL, input=[{"role": "user", "content": "?"},
                                                      *[item.model_dump(exclude_none=True) for item in reply.output],
                                                      {"role": "user", "content": "And Italy?"}])
    await client.responses.create(model=MODEL, input="And Italy?", previous_response_id=reply.id)
    for params in cluster.all_params()[1:]:
        assert [(m.role, m.content, m.reasoning_content) for m in params.messages] == [
            ("user", "?", None), ("assistant", "Paris.", "Capital of France."), ("user", "And Italy?", None)]


async def test_responses_stream_reasoning_then_the_answer():
    app, _ = harmony_app(SCRIPT)
    stream = await openai_sdk(app).responses.create(model=MODEL, input="?", stream=True)
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.reasoning_text.delta"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "Capital of France."
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Paris."
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [(i.type, i.id.split("_")[0]) for i in done] == [("reasoning", "rs"), ("message", "msg")]
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]
    assert kinds[-1] == "response.completed" and [i.type for i in events[-1].response.output] == [
        "reasoning", "message"]


async def test_anthropic_thinking_block_and_text():
    app, _ = harmony_app(SCRIPT)
    reply = await anthropic_sdk(app).messages.create(model=MODEL, max_tokens=64,
                                                     messages=[{"role": "user", "content": "?"}])
    blocks = [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in reply.content]
    assert blocks == [("thinking", "Capital of France."), ("text", "Paris.")]


async def test_ollama_thinking_and_content():
    app, _ = harmony_app(SCRIPT)
    reply = await ollama_sdk(app).chat(model=MODEL, messages=[{"role": "user", "content": "?"}])
    assert (reply.message.thinking, reply.message.content) == ("Capital of France.", "Paris.")


async def test_a_harmony_tool_call_comes_back_as_a_call():
    from tests.api.test_tools_sdk import WEATHER_TOOL

    app, _ = harmony_app(["<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant",
                          "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
                          '{"city": "Paris"}', "<|call|>"])
    reply = await openai_sdk(app).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER_TOOL])
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [("get_weather",
                                                                                     '{"city":"Paris"}')]
    assert message.model_extra["reasoning_content"] == "Weather needed."


def switch_app(switches: tuple[str, ...], fmt: str = "think_tags"):
    card = load_card(builtin_cards_dir() / "local--tiny-llama.toml")
    reasoning = ReasoningSection(format=fmt, start_tag="<think>", end_tag="</think>", switches=switches) \
        if fmt == "think_tags" else ReasoningSection(format=fmt, switches=switches)
    card = card.model_copy(update={"reasoning": reasoning, "capabilities": (*card.capabilities, "thinking")})
    return scripted_app(["Hi"], context_fields={"get_cards": lambda: {MODEL: card}})


async def test_reasoning_switches_reach_the_engine_or_are_refused_by_name():
    from tests.api.scripted_cluster import asgi_http

    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    app, cluster = switch_app(("enable_thinking",))
    async with asgi_http(app) as http:
        off = await http.post("/ollama/api/chat", json={**chat, "think": False})
        effort = await http.post("/ollama/api/chat", json={**chat, "think": "high"})
        openai_off = await http.post("/v1/chat/completions", json={**chat, "reasoning_effort": "none"})
        bad = await http.post("/v1/chat/completions", json={**chat, "reasoning_effort": "extreme"})
    assert off.status_code == 200 and cluster.all_params()[0].thinking is False
    assert effort.status_code == 400 and effort.json()["error"].startswith(f"{MODEL} takes no reasoning level")
    assert openai_off.status_code == 200 and cluster.all_params()[1].thinking is False
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning_effort"

    app, cluster = switch_app(("reasoning_effort",), fmt="harmony")
    async with asgi_http(app) as http:
        high = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", "reasoning": {"effort": "high"}})
        off = await http.post("/v1/chat/completions", json={**chat, "reasoning_effort": "minimal"})
    assert high.status_code == 200 and high.json()["reasoning"] == {"effort": "high", "summary": None}
    assert cluster.all_params()[0].reasoning_effort == "high"
    assert off.status_code == 400 and "always reasons" in off.json()["error"]["message"]

    app, cluster = scripted_app(["Hi"])  # the tiny model's card names no reasoning at all
    async with asgi_http(app) as http:
        on = await http.post("/ollama/api/chat", json={**chat, "think": True})
    assert on.status_code == 400 and "does not reason" in on.json()["error"] and not cluster.commands


def test_thinking_blocks_sent_back_become_the_assistant_turns_reasoning():
    from skulk.api.adapters.anthropic import MessagesRequest, to_params

    params = to_params(MessagesRequest.model_validate({"model": MODEL, "max_tokens": 8, "messages": [
        {"role": "user", "content": "Capital?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "France.", "signature": ""},
                                          {"type": "redacted_thinking", "data": "xx"},
                                          {"type": "text", "text": "Paris."}]},
        {"role": "user", "content": "And Italy?"}]}))
    assert [(m.role, m.content, m.reasoning_content) for m in params.messages] == [
        ("user", "Capital?", None), ("assistant", "Paris.", "France."), ("user", "And Italy?", None)]


async def test_anthropic_thinking_setting_is_the_reasoning_switch():
    from tests.api.scripted_cluster import asgi_http

    message = {"model": MODEL, "max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}]}
    app, cluster = switch_app(("enable_thinking",))
    async with asgi_http(app) as http:
        on = await http.post("/v1/messages", json={**message, "thinking": {"type": "enabled", "budget_tokens": 1024}})
        off = await http.post("/v1/messages", json={**message, "thinking": {"type": "disabled"}})
        adaptive = await http.post("/v1/messages", json={**message, "thinking": {"type": "adaptive"}})
        counted = await http.post("/v1/messages/count_tokens", json={
            "model": MODEL, "messages": message["messages"], "thinking": {"type": "enabled", "budget_tokens": 4096}})
        small = await http.post("/v1/messages", json={**message, "thinking": {"type": "enabled", "budget_tokens": 10}})
        over = await http.post("/v1/messages", json={**message, "thinking": {"type": "enabled", "budget_tokens": 2048}})
        unknown = await http.post("/v1/messages", json={**message, "thinking": {"type": "deep"}})
    assert [r.status_code for r in (on, off, adaptive, counted)] == [200] * 4
    assert [p.thinking for p in cluster.all_params()] == [True, False, None, True]
    assert cluster.all_params()[3].count_only
    for refused, param in ((small, "thinking.budget_tokens"), (over, "thinking.budget_tokens"),
                           (unknown, "thinking.type")):
        assert refused.status_code == 400 and refused.json()["type"] == "error", refused.text
        assert param in refused.json()["error"]["message"]
    assert len(cluster.all_params()) == 4  # nothing refused ran

    app, cluster = scripted_app(["Hi"])  # the tiny model's card names no reasoning at all
    async with asgi_http(app) as http:
        on = await http.post("/v1/messages", json={**message, "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert on.status_code == 400 and not cluster.commands
    assert "does not reason" in on.json()["error"]["message"] and "'thinking.type'" in on.json()["error"]["message"]


# -- scripted token ids through the engines' real token loop ----------------------------------

GPT_OSS_PIECES: list[bytes] = [
    b"<|channel|>", b"analysis", b"<|message|>", b"Capital", b" of", b" Fr", b"ance", b".", b"<|end|>",
    b"<|start|>", b"assistant", b"<|channel|>", b"final", b"<|message|>", b"Paris", b" caf", b"\xc3", b"\xa9",
    b".", b"<|return|>",
]
"""A gpt-oss generation as token ids (id = index): special tokens detokenize to their marker
text (as the llama.cpp engine renders them), a multi-byte character spans two tokens, and
`<|return|>` ends the generation (an end-of-generation id, whose text never reaches a client)."""


def token_loop_texts() -> list[str]:
    import threading

    from skulk.worker.engines.token_loop import token_loop

    ids = iter(range(len(GPT_OSS_PIECES)))
    end = len(GPT_OSS_PIECES) - 1
    tokens = list(token_loop(ids.__next__, GPT_OSS_PIECES.__getitem__, lambda token: token == end,
                             n_prompt=5, max_new=64, stop=[], cancelled=threading.Event()))
    assert tokens[-1].finish_reason == "stop" and "<|return|>" not in "".join(t.text for t in tokens)
    return [t.text for t in tokens]


async def test_harmony_tokens_from_the_token_loop_split_on_all_four_apis():
    from tests.api.test_responses_spec import valid

    texts = token_loop_texts()
    reasoning, answer = "Capital of France.", "Paris café."

    app, _ = harmony_app(texts)
    chat = await openai_sdk(app).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "?"}])
    assert (chat.choices[0].message.model_extra["reasoning_content"], chat.choices[0].message.content) == (
        reasoning, answer)

    app, _ = harmony_app(texts)
    response = await openai_sdk(app).responses.create(model=MODEL, input="?")
    assert response.output_text == answer and [c.text for c in response.output[0].content] == [reasoning]
    valid(response.model_dump(mode="json"))

    app, _ = harmony_app(texts)
    message = await anthropic_sdk(app).messages.create(model=MODEL, max_tokens=64,
                                                       messages=[{"role": "user", "content": "?"}])
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content] == [
        ("thinking", reasoning), ("text", answer)]

    app, _ = harmony_app(texts)
    ollama = await ollama_sdk(app).chat(model=MODEL, messages=[{"role": "user", "content": "?"}])
    assert (ollama.message.thinking, ollama.message.content) == (reasoning, answer)

    # Streamed, the answer's deltas carry no marker either.
    app, _ = harmony_app(texts)
    stream = await openai_sdk(app).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "?"}], stream=True)
    deltas = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert "".join(deltas) == answer
