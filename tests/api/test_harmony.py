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


async def test_responses_answer_has_no_channels():
    app, _ = harmony_app(SCRIPT)
    reply = await openai_sdk(app).responses.create(model=MODEL, input="?")
    assert reply.output_text == "Paris."


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
