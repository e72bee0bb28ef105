"""A GBNF grammar that forces a model's output to be one tool call, for `tool_choice`
"required" (Anthropic "any") or a named function (Anthropic "tool").

`tool_call_grammar(tools, tool_choice)` returns the grammar, or None when the choice does
not force a call (no tools, "auto", "none", unset), so unconstrained requests carry nothing
and the engine's hot path is untouched. The forced output is the Llama 3 JSON form that
`skulk.api.tool_calls` parses for every model:

    {"name": "<one of the allowed tools>", "parameters": <object valid for its schema>}

Each tool's `parameters` JSON Schema is compiled to grammar rules by `SchemaCompiler`. It
supports the subset a grammar can enforce exactly: `type` (one or a list), `properties`,
`required`, `additionalProperties`, `items`, `minItems`/`maxItems`, `minLength`/`maxLength`,
`enum`, `const`, `anyOf`/`oneOf`, a one-element `allOf`, and local `$ref`s into
`$defs`/`definitions` (recursion included). Annotations (`description`, `title`, `default`,
...) are ignored, and so is OpenAPI's `nullable` (JSON Schema does not know it, so a null
would fail a standard validator: the value is simply never null). Every other keyword
(`pattern`, `format`, `minimum`, ...) raises `SchemaNotSupported`: a call whose arguments
could break the schema is never promised. The output is a subset of what the schema
accepts: properties in declaration order (required before optional), no properties beyond
those declared, at most one space between tokens. One gap: `oneOf` compiles like `anyOf`,
so branches that overlap (an integer is also a number) can yield a value matching two.

Pure: no llama.cpp, no wire formats. The API compiles it before dispatch so that a schema it
cannot enforce is the caller's 400 in their wire shape (`SchemaNotSupported`); the engine
compiles it again from the same task fields, so the task carries no grammar text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from skulk.shared.json_shapes import is_json_array, is_json_object
from skulk.shared.types.common import ToolSpec
from skulk.shared.types.tasks import ResponseFormat

MAX_GRAMMAR_REPEAT = 256
"""The largest `maxLength`/`maxItems`/`minLength`/`minItems` compiled exactly. llama.cpp
expands a bounded repetition into one rule per step, so a bound of thousands would build a
grammar of thousands of rules for every request; such schemas are refused instead."""

MAX_INTEGER_DIGITS = 16
"""Digits in a generated integer (and in a number's parts): beyond 2^53 JSON numbers lose
precision in most callers anyway, and a bound keeps a small model from writing digits until
max_tokens ends the call half-written. Exponents get two digits: `1e999` parses as infinity,
which is no JSON number (measured: the tiny model wrote it within three seeds)."""

ANNOTATION_KEYWORDS = frozenset({
    "description", "title", "default", "examples", "example", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "strict", "$defs", "definitions", "discriminator", "nullable",
})
"""Keywords that describe but never constrain: ignored (so are vendor `x-` keywords)."""

SUPPORTED_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "minLength", "maxLength", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
})

FORCING_WORDS = frozenset({"required", "any"})
"""String tool_choice values that force some call (OpenAI "required"; "any" is Anthropic's
word, accepted here too in case a caller's adapter passes it through)."""

BASE_RULES = r"""ws ::= " "?
string ::= "\"" char* "\""
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
number ::= integer ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws (string ws ":" ws value (ws "," ws string ws ":" ws value)*)? ws "}"
array ::= "[" ws (value (ws "," ws value)*)? ws "]"
"""
"""Rules every grammar shares: JSON's lexical pieces and an unconstrained `value`."""

_PRIMITIVE_RULES = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
                    "null": "null"}


class SchemaNotSupported(ValueError):
    """A tool's parameters schema that cannot be compiled to a grammar. `tool` names the
    tool, `path` the place in its schema (JSON Pointer style), `reason` what is wrong."""

    def __init__(self, tool: str, path: str, reason: str, *, subject: str = "tool") -> None:
        what = "the parameters schema" if subject == "tool" else "the schema"
        super().__init__(f"{subject} {tool!r}: {what} at '{path or '/'}' cannot be enforced: {reason}")
        self.tool = tool
        self.subject = subject
        self.path = path
        self.reason = reason


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    out: list[str] = []
    for char in text:
        if char == "\\":
            out.append("\\\\")
        elif char == '"':
            out.append('\\"')
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def json_literal(value: Any) -> str:
    """A JSON value written compactly, as the GBNF literal that matches exactly it."""
    return gbnf_literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def _repeat(item: str, low: int, high: int | None) -> str:
    """`item` repeated low..high times (high None: unbounded), as a GBNF expression."""
    if high == 0:
        return ""
    if high is None:
        return f"({item}){{{low},}}" if low else f"({item})*"
    return f"({item}){{{low},{high}}}"


class SchemaCompiler:
    """Compiles JSON Schemas into named GBNF rules for one grammar (rules are shared and
    deduplicated across the schemas compiled by one instance)."""

    def __init__(self, subject: str = "tool") -> None:
        self._subject = subject
        self._rules: dict[str, str] = {}
        self._by_body: dict[str, str] = {}
        self._refs: dict[tuple[str, str], str] = {}
        self._tool = ""
        self._root: dict[str, Any] = {}

    def _unsupported(self, path: str, reason: str) -> SchemaNotSupported:
        return SchemaNotSupported(self._tool, path, reason, subject=self._subject)

    def document(self, name: str, schema: dict[str, Any]) -> str:
        """The rule for a whole JSON document valid for `schema` (a response format's)."""
        self._tool, self._root = name, schema
        return self.schema(schema, "")

    def rules(self) -> str:
        return "".join(f"{name} ::= {body}\n" for name, body in self._rules.items())

    def add(self, body: str, name: str | None = None) -> str:
        """A rule for `body` (reusing an identical one); its name."""
        if name is None:
            existing = self._by_body.get(body)
            if existing is not None:
                return existing
            name = f"r{len(self._rules)}"
        self._rules[name] = body
        self._by_body.setdefault(body, name)
        return name

    def parameters(self, tool: ToolSpec) -> str:
        """The rule for `tool`'s arguments: always a JSON object."""
        self._tool, self._root = tool.name, tool.parameters
        schema = tool.parameters
        declared = schema.get("type")
        if declared is not None and declared != "object" and not (is_json_array(declared) and "object" in declared):
            raise SchemaNotSupported(tool.name, "/type", f"a tool's parameters must be an object, not {declared!r}")
        shaped = {"properties", "additionalProperties", "$ref", "anyOf", "oneOf", "allOf"} & set(schema)
        if declared is None and not shaped:
            schema = {**schema, "type": "object"}  # `{}`: any object
        elif is_json_array(declared):
            schema = {**schema, "type": "object"}  # arguments are an object whatever else is allowed
        return self.schema(schema, "")

    def schema(self, schema: Any, path: str) -> str:
        """The rule name (or primitive) matching exactly the instances of `schema` this
        compiler generates."""
        if schema is True or schema == {}:
            return "value"
        if not is_json_object(schema):
            raise self._unsupported(path, "a schema must be an object or true")
        for keyword in schema:
            if keyword in SUPPORTED_KEYWORDS or keyword in ANNOTATION_KEYWORDS or keyword.startswith("x-"):
                continue
            raise self._unsupported(f"{path}/{keyword}", f"the keyword {keyword!r} is not supported")
        return self._body(schema, path)

    def _body(self, schema: dict[str, Any], path: str) -> str:
        if "$ref" in schema:
            if len(set(schema) - ANNOTATION_KEYWORDS - {"$ref"}) > 0:
                raise self._unsupported(path, "'$ref' beside other constraints is not supported")
            return self._ref(schema["$ref"], path)
        if "const" in schema:
            return self.add(json_literal(schema["const"]))
        if "enum" in schema:
            values = schema["enum"]
            if not is_json_array(values) or not values:
                raise self._unsupported(f"{path}/enum", "'enum' must be a non-empty list")
            return self.add(" | ".join(json_literal(v) for v in values))
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                branches = schema[keyword]
                if not is_json_array(branches) or not branches:
                    raise self._unsupported(f"{path}/{keyword}", f"'{keyword}' must be a non-empty list")
                rest = {k: v for k, v in schema.items() if k != keyword and k not in ANNOTATION_KEYWORDS}
                if rest:
                    # Siblings constrain every branch: fold them in (a branch's own win).
                    branches = [{**rest, **b} if is_json_object(b) else b for b in branches]
                names = [self.schema(b, f"{path}/{keyword}/{i}") for i, b in enumerate(branches)]
                return self.add(" | ".join(names))
        if "allOf" in schema:
            parts = schema["allOf"]
            if not is_json_array(parts) or len(parts) != 1:
                raise self._unsupported(f"{path}/allOf", "only a one-element 'allOf' is supported")
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            part = parts[0] if is_json_object(parts[0]) else {}
            return self.schema({**rest, **part}, f"{path}/allOf/0")
        declared = schema.get("type")
        if is_json_array(declared):
            if not declared:
                raise self._unsupported(f"{path}/type", "'type' must not be an empty list")
            names = [self._typed(t, schema, path) for t in declared]
            return self.add(" | ".join(names))
        if declared is None:
            if "properties" in schema or "additionalProperties" in schema or "required" in schema:
                return self._typed("object", schema, path)
            if "items" in schema or "minItems" in schema or "maxItems" in schema:
                return self._typed("array", schema, path)
            if "minLength" in schema or "maxLength" in schema:
                return self._typed("string", schema, path)
            return "value"
        return self._typed(declared, schema, path)

    def _typed(self, kind: Any, schema: dict[str, Any], path: str) -> str:
        if kind == "object":
            return self._object(schema, path)
        if kind == "array":
            return self._array(schema, path)
        if kind == "string":
            low, high = self._bounds(schema, "minLength", "maxLength", path)
            if low == 0 and high is None:
                return "string"
            return self.add(f'"\\"" {_repeat("char", low, high)} "\\""')
        if kind in _PRIMITIVE_RULES:
            return _PRIMITIVE_RULES[kind]
        raise self._unsupported(f"{path}/type", f"unknown type {kind!r}")

    def _bounds(self, schema: dict[str, Any], low_key: str, high_key: str, path: str) -> tuple[int, int | None]:
        low, high = schema.get(low_key, 0), schema.get(high_key)
        for key, bound in ((low_key, low), (high_key, high)):
            if bound is None:
                continue
            if not isinstance(bound, int) or isinstance(bound, bool) or bound < 0:
                raise self._unsupported(f"{path}/{key}", f"'{key}' must be a non-negative integer")
            if bound > MAX_GRAMMAR_REPEAT:
                raise self._unsupported(f"{path}/{key}",
                                         f"'{key}' above {MAX_GRAMMAR_REPEAT} is not supported")
        if high is not None and high < low:
            raise self._unsupported(path, f"'{high_key}' is below '{low_key}'")
        return low, high

    def _array(self, schema: dict[str, Any], path: str) -> str:
        item = self.schema(schema.get("items", True), f"{path}/items")
        low, high = self._bounds(schema, "minItems", "maxItems", path)
        if high == 0:
            return self.add('"[" ws "]"')
        if low == 0:
            tail = _repeat(f'ws "," ws {item}', 0, None if high is None else high - 1)
            return self.add(f'"[" ws ({item} {tail})? ws "]"')
        tail = _repeat(f'ws "," ws {item}', low - 1, None if high is None else high - 1)
        return self.add(f'"[" ws {item} {tail} ws "]"')

    def _object(self, schema: dict[str, Any], path: str) -> str:
        properties: object = schema.get("properties") or {}
        required: object = schema.get("required") or []
        if not is_json_object(properties) or not is_json_array(required):
            raise self._unsupported(path, "'properties' must be an object and 'required' a list")
        missing = [name for name in required if name not in properties]
        extra = schema.get("additionalProperties", True)
        if missing and extra is False:
            raise self._unsupported(f"{path}/required",
                                     f"required {missing[0]!r} is neither declared nor allowed as additional")
        if missing:
            # Required but undeclared: any value under the name satisfies the schema.
            properties = {**properties, **{name: extra if is_json_object(extra) else True for name in missing}}
        if not properties:
            if is_json_object(extra):
                value = self.schema(extra, f"{path}/additionalProperties")
                pair = f'string ws ":" ws {value}'
                return self.add(f'"{{" ws ({pair} (ws "," ws {pair})*)? ws "}}"')
            return "object" if extra is not False else self.add('"{" ws "}"')
        pairs = {
            name: self.add(f'{gbnf_literal(json.dumps(name, ensure_ascii=False))} ws ":" ws '
                           f'{self.schema(sub, f"{path}/properties/{name}")}')
            for name, sub in properties.items()
        }
        mandatory = [pairs[name] for name in properties if name in required]
        optional = [pairs[name] for name in properties if name not in required]
        if mandatory:
            inner = ' ws "," ws '.join(mandatory) + "".join(f' (ws "," ws {p})?' for p in optional)
        else:
            # Any in-order subset of the optional pairs, the first without a comma.
            starts = [p + "".join(f' (ws "," ws {q})?' for q in optional[i + 1:]) for i, p in enumerate(optional)]
            inner = "(" + " | ".join(starts) + ")?"
        return self.add(f'"{{" ws {inner} ws "}}"')

    def _ref(self, ref: Any, path: str) -> str:
        if not isinstance(ref, str):
            raise self._unsupported(f"{path}/$ref", "'$ref' must be a string")
        for prefix in ("#/$defs/", "#/definitions/"):
            if ref.startswith(prefix):
                name = ref[len(prefix):]
                defs: Any = self._root.get(prefix[2:-1]) or {}
                if "/" in name or name not in defs:
                    break
                key = (self._tool, ref)
                if key not in self._refs:
                    rule = f"ref{len(self._refs)}"
                    self._refs[key] = rule
                    self._rules[rule] = "null"  # placeholder: a recursive ref finds the name
                    self._rules[rule] = self.schema(defs[name], ref[1:])
                return self._refs[key]
        raise self._unsupported(f"{path}/$ref",
                                 f"only local '#/$defs/...' references are supported: {ref!r}")


def forced_tools(tools: Sequence[ToolSpec], tool_choice: str | dict[str, Any] | None) -> list[ToolSpec]:
    """The tools a call is forced among: all of them for "required"/"any", the named one for
    a function (or Anthropic tool) choice, none otherwise."""
    if not tools or tool_choice is None:
        return []
    if isinstance(tool_choice, str):
        return list(tools) if tool_choice in FORCING_WORDS else []
    kind = tool_choice.get("type")
    if kind == "any":
        return list(tools)
    function = tool_choice.get("function")
    name = function.get("name") if is_json_object(function) else tool_choice.get("name")
    if kind not in ("function", "tool") or not isinstance(name, str):
        return []
    return [t for t in tools if t.name == name]


def tool_call_grammar(tools: Sequence[ToolSpec], tool_choice: str | dict[str, Any] | None) -> str | None:
    """The GBNF grammar whose every sentence is one call of a forced tool with arguments
    valid for its schema, or None when `tool_choice` forces no call. Raises
    `SchemaNotSupported` for a schema a grammar cannot enforce."""
    forced = forced_tools(tools, tool_choice)
    if not forced:
        return None
    compiler = SchemaCompiler()
    calls: list[str] = []
    for tool in forced:
        arguments = compiler.parameters(tool)
        name = gbnf_literal(json.dumps(tool.name, ensure_ascii=False))
        calls.append(compiler.add(
            f'"{{" ws "\\"name\\"" ws ":" ws {name} ws "," ws "\\"parameters\\"" ws ":" ws {arguments} ws "}}"'
        ))
    return f"root ::= {' | '.join(calls)}\n{compiler.rules()}{BASE_RULES}"


def response_grammar(response_format: ResponseFormat | None) -> str | None:
    """The GBNF grammar whose every sentence is a JSON object (`json_object`) or a JSON
    value valid for the schema (`json_schema`), or None without a response format. Raises
    `SchemaNotSupported` (subject "response format") for a schema it cannot enforce."""
    if response_format is None:
        return None
    if response_format.type == "json_object":
        return f"root ::= object\n{BASE_RULES}"
    compiler = SchemaCompiler(subject="response format")
    root = compiler.document(response_format.name, response_format.json_schema or {})
    return f"root ::= {root}\n{compiler.rules()}{BASE_RULES}"


def request_grammar(
    tools: Sequence[ToolSpec], tool_choice: str | dict[str, Any] | None, response_format: ResponseFormat | None
) -> str | None:
    """The one grammar a request is sampled under: a forced tool call wins (its output is
    the call, never the answer), else the response format's, else None (unconstrained)."""
    return tool_call_grammar(tools, tool_choice) or response_grammar(response_format)


def tool_arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    """`tool`'s parameters as the schema of an arguments object (`{}` or a bare `type` list
    means any object), as `SchemaCompiler.parameters` reads them."""
    schema = dict(tool.parameters)
    declared = schema.get("type")
    shaped = {"properties", "additionalProperties", "$ref", "anyOf", "oneOf", "allOf"} & set(schema)
    if (declared is None and not shaped) or is_json_array(declared):
        schema["type"] = "object"
    return schema


def request_json_schema(
    tools: Sequence[ToolSpec], tool_choice: str | dict[str, Any] | None, response_format: ResponseFormat | None
) -> dict[str, Any] | None:
    """The JSON Schema of what `request_grammar` lets the model write, for engines that
    constrain decoding by schema (llguidance on MLX) rather than by GBNF: a forced call
    `{"name": ..., "parameters": ...}` of one of the forced tools, else the response
    format's document, else None. Call `request_grammar` first: it refuses the schemas no
    engine enforces, so every engine refuses alike."""
    forced = forced_tools(tools, tool_choice)
    if forced:
        # Each tool's schema lives under `$defs` of the call schema, its local refs rebased
        # there (they point into the tool's own schema, which is no longer the root).
        defs = {f"tool{i}": _rebased(bounded_numbers(tool_arguments_schema(tool)), f"#/$defs/tool{i}")
                for i, tool in enumerate(forced)}
        calls = [{
            "type": "object",
            "properties": {"name": {"const": tool.name}, "parameters": {"$ref": f"#/$defs/tool{i}"}},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        } for i, tool in enumerate(forced)]
        schema: dict[str, Any] = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "$defs": defs}
    elif response_format is None:
        return None
    elif response_format.type == "json_object":
        schema = {"type": "object"}
    else:
        schema = bounded_numbers(dict(response_format.json_schema or {}))
    # Compact JSON, as the grammar writes it (`ws` is at most one space): a model cannot
    # pad its answer with whitespace until max_tokens.
    return {**schema, "x-guidance": {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}}


def _rebased(schema: Any, base: str) -> Any:
    """`schema` with every local `$ref` ("#...") pointing below `base` instead of the root."""
    if is_json_array(schema):
        return [_rebased(item, base) for item in schema]
    if not is_json_object(schema):
        return schema
    out = {key: value if key in _LITERAL_KEYWORDS else _rebased(value, base) for key, value in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = base + ref[1:]
    return out


INTEGER_BOUND = 10**MAX_INTEGER_DIGITS - 1
_LITERAL_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
"""Keywords whose values are JSON instances, never schemas: left as they are."""


def bounded_numbers(schema: Any) -> Any:
    """`schema` with every integer bounded to `MAX_INTEGER_DIGITS` digits where it sets no
    bound of its own, as the grammar's `integer` rule is: a small model cannot write digits
    until max_tokens. Pure; the input is not changed."""
    if is_json_array(schema):
        return [bounded_numbers(item) for item in schema]
    if not is_json_object(schema):
        return schema
    out = {key: value if key in _LITERAL_KEYWORDS else bounded_numbers(value) for key, value in schema.items()}
    kinds = schema.get("type")
    if kinds == "integer" or (is_json_array(kinds) and kinds == ["integer"]):
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = INTEGER_BOUND
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -INTEGER_BOUND
    return out


__all__ = [
    "ANNOTATION_KEYWORDS",
    "BASE_RULES",
    "FORCING_WORDS",
    "MAX_GRAMMAR_REPEAT",
    "MAX_INTEGER_DIGITS",
    "SUPPORTED_KEYWORDS",
    "SchemaCompiler",
    "SchemaNotSupported",
    "bounded_numbers",
    "forced_tools",
    "gbnf_literal",
    "json_literal",
    "request_grammar",
    "request_json_schema",
    "response_grammar",
    "tool_arguments_schema",
    "tool_call_grammar",
]
