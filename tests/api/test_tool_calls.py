"""The tool-call parser, table-driven: each format the common chat templates teach, and the
outputs that must stay prose."""

from __future__ import annotations

import pytest

from skulk.api.tool_calls import ParsedCall, parse_tool_calls

TOOLS = {"get_weather", "add"}
WEATHER = ParsedCall("get_weather", '{"city":"Paris"}')


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        # Hermes / Qwen
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "", [WEATHER]),
        ('Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
         "Let me check.", [WEATHER]),
        ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>\n'
         '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
         "", [WEATHER, ParsedCall("add", '{"a":1,"b":2}')]),
        # arguments given as a JSON string
        ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>', "", [WEATHER]),
        # Llama 3.x JSON
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [WEATHER]),
        ('  <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [WEATHER]),
        ('{"type": "function", "name": "get_weather", "parameters": {"city": "Paris"}}', "", [WEATHER]),
        ('[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "add", "parameters": {}}]',
         "", [WEATHER, ParsedCall("add", "{}")]),
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "add", "parameters": {"a": 1}}',
         "", [WEATHER, ParsedCall("add", '{"a":1}')]),
        ('```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```', "", [WEATHER]),
        ('{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}', "", [WEATHER]),
        # no arguments at all: an empty object
        ('{"name": "add"}', "", [ParsedCall("add", "{}")]),
        # Mistral
        ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', "", [WEATHER]),
        # Functionary / Llama 3.1 custom tags
        ('<function=get_weather>{"city": "Paris"}</function>', "", [WEATHER]),
        ('Sure. <function=add>{"a": 1}</function>', "Sure.", [ParsedCall("add", '{"a":1}')]),
        # non-ASCII arguments stay readable
        ('{"name": "get_weather", "parameters": {"city": "Zürich"}}', "", [ParsedCall("get_weather", '{"city":"Zürich"}')]),
    ],
)
def test_recognised_formats(text, content, calls):
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.calls == calls
    assert parsed.content == content


@pytest.mark.parametrize(
    "text",
    [
        "The weather in Paris is sunny.",
        "",
        # a JSON answer with a "name" key that is not an offered tool
        '{"name": "Alice", "age": 30}',
        # a known tool name but arguments that are not an object
        '{"name": "get_weather", "parameters": [1, 2]}',
        # truncated by max_tokens
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',
        '{"name": "get_weather", "parameters": {"city": "Par',
        # one good call and one bad one: not half a result
        '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call><tool_call>{"name": "rm"}</tool_call>',
        "<function=unknown>{}</function>",
        "[TOOL_CALLS]not json",
        # mentions the tool in prose
        "I would call get_weather with city Paris.",
    ],
)
def test_prose_stays_prose(text):
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.calls == []
    assert parsed.content == text


def test_no_tools_offered_means_no_calls():
    text = '{"name": "get_weather", "parameters": {}}'
    assert parse_tool_calls(text, ()).calls == []


def test_the_cards_format_is_tried_first():
    from skulk.api.tool_calls import parse_tool_calls

    text = '<tool_call>{"name": "f", "arguments": {"a": 2}}</tool_call> [TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]'
    assert [c.arguments for c in parse_tool_calls(text, {"f"}).calls] == ['{"a":2}']  # hermes first by default
    assert [c.arguments for c in parse_tool_calls(text, {"f"}, "mistral").calls] == ['{"a":1}']
