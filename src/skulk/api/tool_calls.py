"""Tool calls out of a model's finished text: the common formats chat templates teach.

`parse_tool_calls(text, tool_names)` returns the prose that is left and the calls it
found, each with its arguments as canonical JSON text. Recognised formats (first that
matches wins, see `_FORMATS`):

- Hermes / Qwen: `<tool_call>{"name": .., "arguments": {..}}</tool_call>`, any number,
  prose around them kept as content;
- Mistral: `[TOOL_CALLS][{"name": .., "arguments": {..}}, ...]`;
- Functionary / Llama 3.1 custom: `<function=name>{..}</function>`;
- Llama 3.x JSON: the whole output is one object `{"name": .., "parameters": {..}}` (or a
  list of them, or objects separated by `;`), optionally after `<|python_tag|>` or inside a
  markdown code fence.

A call counts only when its name is one of the offered tools and its arguments are a JSON
object: a model asked for a JSON answer that happens to have a "name" key must stay an
answer. A malformed or truncated call (max_tokens cut it) is left as text. This module is
pure: no ids, no clocks, no wire formats. `check_enforceable` is the adapters' one check
that a forced call (tool_choice "required" or a named tool) can be grammar-enforced.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from skulk.api.errors import InvalidRequest
from skulk.shared.tool_grammar import SchemaNotSupported, tool_call_grammar
from skulk.shared.types.common import ToolSpec

ARGUMENT_KEYS = ("arguments", "parameters")
"""Where formats put a call's arguments: Hermes/Qwen/Mistral say `arguments`, Llama 3 says
`parameters`."""


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str
    """A JSON object, as canonical compact JSON text."""


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    calls: list[ParsedCall] = field(default_factory=list)


def _arguments(value: Any) -> str | None:
    """Canonical JSON text of a call's arguments, or None when they are not an object."""
    if isinstance(value, str):  # some models write the arguments as a JSON string
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if value is None:
        value = {}
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _call(obj: Any, tool_names: Collection[str], name: str | None = None) -> ParsedCall | None:
    """A call from one decoded object, or None when it is not a call of an offered tool."""
    if not isinstance(obj, dict):
        return None
    if name is None:
        function = obj.get("function")
        if isinstance(function, dict):  # {"type": "function", "function": {"name", "arguments"}}
            obj = function
        name = obj.get("name")
        args: Any = next((obj[key] for key in ARGUMENT_KEYS if key in obj), None)
    else:
        args = obj
    if not isinstance(name, str) or name not in tool_names:
        return None
    arguments = _arguments(args)
    return None if arguments is None else ParsedCall(name, arguments)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _hermes(text: str, tool_names: Collection[str]) -> ParsedOutput | None:
    matches = list(_HERMES.finditer(text))
    if not matches:
        return None
    calls = [_call(_loads(m.group(1)), tool_names) for m in matches]
    if any(c is None for c in calls):
        return None
    content = _HERMES.sub("", text)
    return ParsedOutput(content.strip(), [c for c in calls if c is not None])


_FUNCTION_TAG = re.compile(r"<function=([^>\s]+)>\s*(.*?)\s*</function>", re.DOTALL)


def _function_tags(text: str, tool_names: Collection[str]) -> ParsedOutput | None:
    matches = list(_FUNCTION_TAG.finditer(text))
    if not matches:
        return None
    calls = [_call(_loads(m.group(2) or "{}"), tool_names, name=m.group(1)) for m in matches]
    if any(c is None for c in calls):
        return None
    return ParsedOutput(_FUNCTION_TAG.sub("", text).strip(), [c for c in calls if c is not None])


MISTRAL_MARKER = "[TOOL_CALLS]"


def _mistral(text: str, tool_names: Collection[str]) -> ParsedOutput | None:
    at = text.find(MISTRAL_MARKER)
    if at == -1:
        return None
    calls = _json_calls(text[at + len(MISTRAL_MARKER):], tool_names)
    return None if calls is None else ParsedOutput(text[:at].strip(), calls)


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
PYTHON_TAG = "<|python_tag|>"


def _json_calls(text: str, tool_names: Collection[str]) -> list[ParsedCall] | None:
    """Calls when `text` is wholly a call object, a list of them, or objects joined by `;`."""
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    decoded = _loads(text)
    if decoded is None and ";" in text:
        parts = [_loads(part) for part in text.split(";") if part.strip()]
        decoded = None if any(p is None for p in parts) else parts
    objects = decoded if isinstance(decoded, list) else [decoded]
    if not objects:
        return None
    calls = [_call(obj, tool_names) for obj in objects]
    if any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _llama_json(text: str, tool_names: Collection[str]) -> ParsedOutput | None:
    stripped = text.strip()
    if stripped.startswith(PYTHON_TAG):
        stripped = stripped[len(PYTHON_TAG):]
    if not stripped.lstrip().startswith(("{", "[", "```")):
        return None
    calls = _json_calls(stripped, tool_names)
    return None if calls is None else ParsedOutput("", calls)


_FORMATS: tuple[Callable[[str, Collection[str]], ParsedOutput | None], ...] = (
    _hermes,
    _mistral,
    _function_tags,
    _llama_json,
)


BY_CARD_FORMAT: dict[str, Callable[[str, Collection[str]], ParsedOutput | None]] = {
    "hermes": _hermes,
    "mistral": _mistral,
    "llama3_json": _llama_json,
    # skulk.api.harmony rewrites a harmony call (`to=functions.NAME ... <|message|>{..}`)
    # into a `<function=NAME>{..}</function>` tag on its way out of the splitter.
    "harmony": _function_tags,
}
"""A card's `tooling.tool_call_format` -> the parser tried first."""


def parse_tool_calls(text: str, tool_names: Collection[str], card_format: str | None = None) -> ParsedOutput:
    """The content and tool calls in a model's finished `text`; with no recognisable call
    of an offered tool, the text is returned unchanged as content. The card's format (when
    it names one) is tried first, then every other."""
    preferred = BY_CARD_FORMAT.get(card_format or "")
    if tool_names:
        for parse in ((preferred,) if preferred else ()) + tuple(p for p in _FORMATS if p is not preferred):
            parsed = parse(text, tool_names)
            if parsed is not None and parsed.calls:
                return parsed
    return ParsedOutput(text)


def check_enforceable(
    tools: Sequence[ToolSpec], tool_choice: str | dict[str, Any] | None, schema_param: Callable[[int], str]
) -> None:
    """`InvalidRequest` (a 400 in the caller's shape) when `tool_choice` forces a call but a
    forced tool's schema cannot be turned into the grammar that enforces it
    (`skulk.shared.tool_grammar`); `schema_param(index)` is the caller's name for the
    schema of `tools[index]`. Nothing to check (and nothing compiled) otherwise."""
    try:
        tool_call_grammar(tools, tool_choice)
    except SchemaNotSupported as exc:
        index = next((i for i, t in enumerate(tools) if t.name == exc.tool), 0)
        raise InvalidRequest(
            f"{exc} A forced tool call (tool_choice) needs a schema this server can enforce; "
            "simplify the schema or let the model choose (tool_choice 'auto').",
            param=schema_param(index), code="unsupported_tool_schema",
        ) from None


__all__ = [
    "ARGUMENT_KEYS", "MISTRAL_MARKER", "PYTHON_TAG", "ParsedCall", "ParsedOutput", "check_enforceable",
    "parse_tool_calls",
]
