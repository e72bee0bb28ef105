"""The tool-call grammar as data: which tool_choice forces which tools, what the compiled
rules say, and which schemas are refused. That the grammars parse in llama.cpp and make a
real model write valid calls is tested with the engine
(tests/worker/engines/test_llama_cpp_grammar.py)."""

from __future__ import annotations

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
