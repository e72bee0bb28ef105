"""The tool-call grammar as data: which tool_choice forces which tools, what the compiled
rules say, and which schemas are refused. That the grammars parse in llama.cpp and make a
real model write valid calls is tested with the engine
(tests/worker/engines/test_llama_cpp_grammar.py)."""

from __future__ import annotations

import json

import pytest

from skulk.shared.tool_grammar import (
    MAX_GRAMMAR_REPEAT,
    SchemaCompiler,
    SchemaNotSupported,
    forced_tools,
    gbnf_literal,
    json_literal,
    tool_call_grammar,
)
from skulk.shared.types.common import ToolSpec

WEATHER = ToolSpec(name="get_weather", parameters={
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
TIME = ToolSpec(name="get_time", parameters={})


@pytest.mark.parametrize(
    ("tools", "choice", "forced"),
    [
        ([WEATHER, TIME], None, []),
        ([WEATHER, TIME], "auto", []),
        ([WEATHER, TIME], "none", []),
        ([WEATHER, TIME], "required", ["get_weather", "get_time"]),
        ([WEATHER, TIME], "any", ["get_weather", "get_time"]),
        ([WEATHER, TIME], {"type": "any"}, ["get_weather", "get_time"]),
        ([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}}, ["get_time"]),
        ([WEATHER, TIME], {"type": "tool", "name": "get_weather"}, ["get_weather"]),
        ([WEATHER, TIME], {"type": "function", "function": {"name": "absent"}}, []),
        ([WEATHER, TIME], {"type": "auto"}, []),
        ([], "required", []),
    ],
)
def test_which_tools_a_choice_forces(tools, choice, forced):
    assert [t.name for t in forced_tools(tools, choice)] == forced


@pytest.mark.parametrize("choice", [None, "auto", "none"])
def test_no_grammar_unless_a_call_is_forced(choice):
    assert tool_call_grammar([WEATHER], choice) is None


def test_a_forced_grammar_offers_exactly_the_forced_tools_in_the_llama_json_form():
    grammar = tool_call_grammar([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}})
    root = grammar.splitlines()[0]
    assert root.startswith("root ::= ")
    assert '"\\"get_weather\\""' in grammar and "get_time" not in grammar
    assert '"\\"parameters\\""' in grammar and '"\\"city\\""' in grammar
    both = tool_call_grammar([WEATHER, TIME], "required")
    assert both.splitlines()[0].count("|") == 1


@pytest.mark.parametrize(
    ("text", "literal"),
    [('say "hi"', '"say \\"hi\\""'), ("a\\b", '"a\\\\b"'), ("l1\nl2\t", '"l1\\nl2\\t"'), ("\x01", '"\\x01"'),
     ("café", '"café"')],
)
def test_gbnf_literals_escape_what_gbnf_reads_specially(text, literal):
    assert gbnf_literal(text) == literal


def test_json_literals_are_compact_json():
    assert json_literal({"a": [1, None]}) == '"{\\"a\\":[1,null]}"'


def compile_rules(schema):
    compiler = SchemaCompiler()
    top = compiler.parameters(ToolSpec(name="t", parameters=schema))
    return top, compiler.rules()


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        # `{}` and a bare object schema: any JSON object.
        ({}, "object"),
        ({"type": "object"}, "object"),
        # Only declared properties, required ones first, optional ones each optional.
        ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["b"]},
         '"{" ws r1 (ws "," ws r0)? ws "}"'),
        # No required properties: any in-order subset.
        ({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}}},
         '"{" ws (r0 (ws "," ws r1)? | r1)? ws "}"'),
        ({"type": "object", "additionalProperties": False}, '"{" ws "}"'),
    ],
)
def test_objects_compile_to_rules(schema, expected):
    top, rules = compile_rules(schema)
    body = top if top == "object" else next(line.split(" ::= ", 1)[1] for line in rules.splitlines()
                                            if line.startswith(f"{top} ::= "))
    assert body == expected


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        ({"properties": {"s": {"type": "string", "minLength": 2, "maxLength": 5}}}, "(char){2,5}"),
        ({"properties": {"s": {"type": "string", "maxLength": 0}}}, '"\\""  "\\""'),
        ({"properties": {"l": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}}},
         '"[" ws integer (ws "," ws integer){0,2} ws "]"'),
        ({"properties": {"e": {"enum": ["a", 1, None]}}}, '"\\"a\\"" | "1" | "null"'),
        ({"properties": {"c": {"const": "x"}}}, '"\\"x\\""'),
        ({"properties": {"u": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}, "string | integer"),
        ({"properties": {"t": {"type": ["string", "null"]}}}, "string | null"),
        ({"properties": {"n": {"type": "number", "nullable": True}}}, '"\\"n\\"" ws ":" ws number\n'),
        ({"properties": {"m": {"type": "object", "additionalProperties": {"type": "boolean"}}}},
         '(string ws ":" ws boolean (ws "," ws string ws ":" ws boolean)*)?'),
        ({"properties": {"d": {"type": "string", "description": "ignored", "title": "T", "x-vendor": 1}}},
         '"\\"d\\"" ws ":" ws string'),
    ],
)
def test_keywords_compile_to_rules(schema, needle):
    _, rules = compile_rules({"type": "object", **schema})
    assert needle in rules


def test_local_refs_become_shared_rules_even_when_recursive():
    schema = {
        "type": "object",
        "properties": {"tree": {"$ref": "#/$defs/node"}},
        "required": ["tree"],
        "$defs": {"node": {"type": "object", "properties": {
            "label": {"type": "string", "maxLength": 4},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
        }, "required": ["label"]}},
    }
    _, rules = compile_rules(schema)
    ref_rules = [line for line in rules.splitlines() if line.startswith("ref0 ::= ")]
    assert len(ref_rules) == 1
    assert "ref0" in ref_rules[0].split(" ::= ")[1] or any("ref0" in line for line in rules.splitlines()[1:])


@pytest.mark.parametrize(
    ("schema", "path", "reason"),
    [
        ({"type": "string"}, "/type", "must be an object"),
        ({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}}, "/properties/s/pattern",
         "'pattern'"),
        ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}, "/properties/d/format",
         "'format'"),
        ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}, "/properties/n/minimum",
         "'minimum'"),
        ({"type": "object", "properties": {"s": {"type": "string", "maxLength": MAX_GRAMMAR_REPEAT + 1}}},
         "/properties/s/maxLength", "above"),
        ({"type": "object", "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 2}}},
         "/properties/s", "below"),
        ({"type": "object", "properties": {"r": {"$ref": "https://example.com/s.json"}}}, "/properties/r/$ref",
         "local"),
        ({"type": "object", "properties": {"r": {"$ref": "#/$defs/missing"}}}, "/properties/r/$ref", "local"),
        ({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"maxLength": 3}]}}},
         "/properties/a/allOf", "one-element"),
        ({"type": "object", "properties": {"x": {"type": "date"}}}, "/properties/x/type", "unknown type"),
        ({"type": "object", "required": ["x"], "additionalProperties": False}, "/required", "neither declared"),
    ],
)
def test_schemas_a_grammar_cannot_enforce_are_refused_with_the_place(schema, path, reason):
    with pytest.raises(SchemaNotSupported) as caught:
        tool_call_grammar([ToolSpec(name="t", parameters=schema)], "required")
    assert (caught.value.tool, caught.value.path) == ("t", path)
    assert reason in str(caught.value)


def test_a_refused_schema_of_an_unforced_tool_does_not_matter():
    odd = ToolSpec(name="odd", parameters={"type": "object", "properties": {"s": {"pattern": "x"}}})
    assert tool_call_grammar([WEATHER, odd], {"type": "function", "function": {"name": "get_weather"}})
    assert tool_call_grammar([WEATHER, odd], "auto") is None


# -- the same constraint as a JSON Schema (llguidance on MLX) -----------------------------

ENFORCED = [
    {},
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["b"]},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 5}}},
    {"type": "object", "properties": {"l": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}}},
    {"type": "object", "properties": {"e": {"enum": ["a", 1, None]}, "c": {"const": "x"}}},
    {"type": "object", "properties": {"u": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                                      "t": {"type": ["string", "null"]}}},
    {"type": "object", "properties": {"m": {"type": "object", "additionalProperties": {"type": "boolean"}}}},
    {"type": "object", "properties": {"tree": {"$ref": "#/$defs/node"}}, "$defs": {"node": {
        "type": "object", "properties": {"label": {"type": "string", "maxLength": 4},
                                         "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}},
]
"""Schemas the grammar compiler enforces: llguidance must compile each one too."""


@pytest.mark.parametrize("schema", ENFORCED)
def test_every_schema_the_grammar_enforces_compiles_for_llguidance(schema):
    import llguidance

    from skulk.shared.tool_grammar import request_json_schema, tool_call_grammar
    from skulk.shared.types.tasks import ResponseFormat

    tools = [ToolSpec(name="t", parameters=schema)]
    assert tool_call_grammar(tools, "required") is not None  # the grammar enforces it
    for as_json in (request_json_schema(tools, "required", None),
                    request_json_schema([], None, ResponseFormat(type="json_schema", json_schema=schema))):
        grammar = llguidance.grammar_from("json_schema", json.dumps(as_json))
        assert llguidance.LLMatcher.validate_grammar(grammar) == "", as_json


@pytest.mark.parametrize(("schema", "expected"), [
    ({"type": "integer"}, {"type": "integer", "maximum": 10**16 - 1, "minimum": -(10**16 - 1)}),
    ({"type": "integer", "maximum": 5}, {"type": "integer", "maximum": 5, "minimum": -(10**16 - 1)}),
    ({"properties": {"n": {"type": "integer"}}, "enum": [{"type": "integer"}]},
     {"properties": {"n": {"type": "integer", "maximum": 10**16 - 1, "minimum": -(10**16 - 1)}},
      "enum": [{"type": "integer"}]}),  # instances (enum, const) are never rewritten
    ({"type": "string"}, {"type": "string"}),
])
def test_integers_are_bounded_as_the_grammar_bounds_them(schema, expected):
    from skulk.shared.tool_grammar import bounded_numbers

    assert bounded_numbers(schema) == expected


def test_a_forced_call_schema_names_the_tool_and_writes_compact_json():
    from skulk.shared.tool_grammar import request_json_schema

    tools = [ToolSpec(name="f", parameters={}), ToolSpec(name="g", parameters={})]
    schema = request_json_schema(tools, "required", None)
    assert [c["properties"]["name"] for c in schema["anyOf"]] == [{"const": "f"}, {"const": "g"}]
    assert [c["properties"]["parameters"] for c in schema["anyOf"]] == [{"$ref": "#/$defs/tool0"},
                                                                       {"$ref": "#/$defs/tool1"}]
    assert schema["x-guidance"]["whitespace_flexible"] is False
    assert request_json_schema([], None, None) is None
