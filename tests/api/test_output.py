"""OutputShaper: reasoning marked apart, tool calls assembled once at the end, and prose
requests passed through untouched."""

from __future__ import annotations

from skulk.api.output import OutputShaper
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.common import ChatMessage, ToolSpec, Usage
from skulk.shared.types.tasks import TextGenerationParams

USAGE = Usage(prompt_tokens=4, completion_tokens=3, total_tokens=7)
CHAT = dict(model_id="m", messages=[ChatMessage(role="user", content="hi")])
TOOLS = [ToolSpec(name="get_weather", parameters={"type": "object"})]


def chunks(*texts: str, finish: str = "stop") -> list[TokenChunk]:
    last = len(texts) - 1
    return [
        TokenChunk(command_id="c", text=t, token_id=i, logprob=-0.5,
                   finish_reason=finish if i == last else None, usage=USAGE if i == last else None)
        for i, t in enumerate(texts)
    ]


def shape(params: TextGenerationParams, items: list[TokenChunk]) -> list[TokenChunk]:
    shaper = OutputShaper(params, lambda i: f"call_{i}")
    out = [c for item in items for c in shaper.push(item)]
    return out + shaper.finish()


def test_prose_without_tools_passes_through_unchanged():
    items = chunks("Hel", "lo")
    out = shape(TextGenerationParams(**CHAT), items)
    assert out == items


def test_raw_prompts_are_never_split():
    items = chunks("<think>", "x</think>y")
    assert shape(TextGenerationParams(model_id="m", prompt="p"), items) == items


def test_reasoning_is_marked_and_the_ending_kept():
    out = shape(TextGenerationParams(**CHAT), chunks("<think>", "why", "</think>", "\n\nok"))
    assert [(c.text, c.reasoning) for c in out if c.text] == [("why", True), ("ok", False)]
    assert out[-1].finish_reason == "stop" and out[-1].usage == USAGE


def test_tool_call_is_assembled_once_at_the_end():
    params = TextGenerationParams(**CHAT, tools=TOOLS)
    shaper = OutputShaper(params, lambda i: f"call_{i}")
    items = chunks('<tool_call>{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', "</tool_call>")
    assert [c for item in items for c in shaper.push(item)] == []  # nothing leaves before the end
    (call_chunk,) = shaper.finish()
    assert call_chunk.finish_reason == "tool_calls"
    assert call_chunk.usage == USAGE
    assert call_chunk.text == ""
    assert [(c.id, c.name, c.arguments) for c in call_chunk.tool_calls] == [("call_0", "get_weather", '{"city":"Paris"}')]


def test_prose_answer_to_a_tool_request_comes_back_whole():
    params = TextGenerationParams(**CHAT, tools=TOOLS)
    items = chunks("It is ", "sunny.", finish="length")
    assert shape(params, items) == items


def test_reasoning_streams_before_a_tool_call():
    params = TextGenerationParams(**CHAT, tools=TOOLS)
    shaper = OutputShaper(params, lambda i: f"call_{i}")
    first = shaper.push(chunks("<think>plan</think>")[0])
    assert [(c.text, c.reasoning) for c in first] == [("plan", True)]
    shaper.push(TokenChunk(command_id="c", text='{"name": "get_weather", "parameters": {}}', finish_reason="stop"))
    (call_chunk,) = shaper.finish()
    assert call_chunk.tool_calls[0].name == "get_weather"


def test_tool_choice_none_streams_prose():
    params = TextGenerationParams(**CHAT, tools=TOOLS, tool_choice="none")
    items = chunks('{"name": "get_weather", "parameters": {}}')
    assert shape(params, items) == items
