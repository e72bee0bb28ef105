"""Request options every wire format spells its own way, read into the internal form once:
structured output (OpenAI `response_format`, Responses `text.format`, Ollama `format`),
repetition penalties and logit bias.

Each reader returns the internal value or raises `InvalidRequest` naming the caller's
parameter. A response schema is compiled here to the grammar that will enforce it
(`skulk.shared.tool_grammar.response_grammar`), so a schema no grammar can enforce is the
caller's 400 naming the unsupported keyword before anything reaches the cluster.

Whether the placed engine honours an option is not decided here: that is the engine traits
table's job, read by `skulk.api.generation.bind_instance`. Pure: no streams, no cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from skulk.api.errors import InvalidRequest
from skulk.shared.tool_grammar import SchemaNotSupported, response_grammar
from skulk.shared.types.tasks import ResponseFormat

MAX_LOGIT_BIAS = 100.0
"""OpenAI's bound on a logit bias value (-100 bans a token, 100 all but forces it)."""

MAX_LOGIT_BIAS_ENTRIES = 1024
"""Tokens one request may bias. OpenAI allows 300; a bound keeps the per-token work small."""

PENALTY_RANGE = (-2.0, 2.0)
"""OpenAI's range for `frequency_penalty` and `presence_penalty`."""


def _enforceable(response_format: ResponseFormat, param: str) -> ResponseFormat:
    try:
        response_grammar(response_format)
    except SchemaNotSupported as exc:
        raise InvalidRequest(
            f"{exc}. Structured output is enforced by constrained decoding, which supports the JSON Schema "
            "keywords type, properties, required, additionalProperties, items, minItems, maxItems, minLength, "
            "maxLength, enum, const, anyOf, oneOf, a one-element allOf and local $ref.",
            param=f"{param}{exc.path.replace('/', '.')}" if exc.path else param, code="unsupported_schema",
        ) from None
    return response_format


def _schema_format(name: Any, schema: Any, param: str, schema_param: str | None = None) -> ResponseFormat:
    schema_param = schema_param or f"{param}.schema"
    if not isinstance(schema, Mapping):
        raise InvalidRequest("A json_schema response format needs a 'schema' object.", param=schema_param)
    try:
        built = ResponseFormat(type="json_schema", name=str(name or "response"), json_schema=dict(schema))
    except ValidationError as error:
        raise InvalidRequest(f"Invalid response format: {error.errors()[0]['msg']}", param=param) from None
    return _enforceable(built, schema_param)


def _bad_type(value: Any, param: str, allowed: str) -> InvalidRequest:
    return InvalidRequest(f"Invalid {param} {value!r}; expected {allowed}.", param=param)


def openai_response_format(value: Any, param: str = "response_format") -> ResponseFormat | None:
    """Chat Completions' `response_format`: `{"type": "text"}` (or absent) leaves output
    free; `json_object`; `json_schema` with `{"json_schema": {"name", "schema", "strict"}}`."""
    def schema(value: Mapping[str, Any]) -> ResponseFormat:
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping):
            raise InvalidRequest("A json_schema response format needs a 'json_schema' object.",
                                 param=f"{param}.json_schema")
        return _schema_format(spec.get("name"), spec.get("schema"), f"{param}.json_schema")

    return _format_of(value, param, schema)


def responses_text_format(value: Any, param: str = "text.format") -> ResponseFormat | None:
    """The Responses API's `text.format`: like `response_format`, with the json_schema's
    `name`, `schema` and `strict` at the top level."""
    return _format_of(value, param, lambda value: _schema_format(value.get("name"), value.get("schema"), param))


def _format_of(value: Any, param: str,
               schema: Callable[[Mapping[str, Any]], ResponseFormat]) -> ResponseFormat | None:
    """The output format both APIs spell alike: absent or `text` leaves output free,
    `json_object`, or `json_schema` (where each API keeps the schema is `schema`'s part)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        # llama-server's extension (its test suite sends it): a json_object with a `schema`
        # is that schema, enforced like json_schema, never dropped to "any object".
        if "schema" in value and value["schema"] is not None:
            if not isinstance(value["schema"], Mapping):
                raise _bad_type(value["schema"], f"{param}.schema", "a JSON Schema object")
            return _schema_format("json_object", value["schema"], f"{param}.schema", schema_param=f"{param}.schema")
        return ResponseFormat(type="json_object")
    if kind == "json_schema":
        return schema(value)
    raise _bad_type(value, f"{param}.type", "'text', 'json_object' or 'json_schema'")


def ollama_format(value: Any, param: str = "format") -> ResponseFormat | None:
    """Ollama's `format`: "json" (any JSON object, as Ollama's JSON mode) or a JSON Schema."""
    if value is None or value == "":
        return None
    if value == "json":
        return ResponseFormat(type="json_object")
    if isinstance(value, Mapping):
        return _schema_format("format", value, param, schema_param=param)
    raise _bad_type(value, param, "'json' or a JSON Schema object")


REASONING_LEVELS = ("low", "medium", "high")
OFF_LEVELS = ("none", "minimal")
"""OpenAI's efforts that mean "do not reason": a model with an on/off switch turns it off."""


def reasoning_choice(value: Any, param: str, *, booleans: bool = False) -> dict[str, Any]:
    """A wire format's reasoning setting as params fields (`thinking`, `reasoning_effort`):
    a level, an off level ('none', 'minimal'), or (Ollama's `think`) true/false."""
    if value is None:
        return {}
    if booleans and isinstance(value, bool):
        return {"thinking": value}
    if value in REASONING_LEVELS:
        return {"reasoning_effort": value}
    if value in OFF_LEVELS:
        return {"thinking": False}
    allowed = ("true, false, " if booleans else "") + ", ".join(f"'{v}'" for v in (*REASONING_LEVELS, *OFF_LEVELS))
    raise InvalidRequest(f"Invalid {param} {value!r}; expected {allowed}.", param=param)


def penalty(value: float | None, param: str) -> float | None:
    """A frequency or presence penalty within OpenAI's range."""
    low, high = PENALTY_RANGE
    # A positive range test, so that NaN fails too.
    if value is not None and not (low <= value <= high):
        raise InvalidRequest(f"'{param}' must be between {low:g} and {high:g}, got {value}.", param=param)
    return value


def repeat_penalty(value: float | None, param: str) -> float | None:
    """llama.cpp's multiplicative repeat penalty: positive (1 is off)."""
    if value is not None and not value > 0:
        raise InvalidRequest(f"'{param}' must be greater than 0, got {value}.", param=param)
    return value


def logit_bias(value: Mapping[str, float] | None, param: str = "logit_bias") -> dict[int, float]:
    """OpenAI's `logit_bias` (token id as a string -> bias in [-100, 100]) as ids -> bias.
    Whether the ids exist is the engine's to check: only it knows the vocabulary."""
    if not value:
        return {}
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise InvalidRequest(f"'{param}' may bias at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(value)}.",
                             param=param)
    out: dict[int, float] = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise InvalidRequest(f"'{param}' keys must be token ids, got {key!r}.", param=param) from None
        if token < 0:
            raise InvalidRequest(f"'{param}' keys must be token ids, got {key!r}.", param=param)
        if not isinstance(bias, (int, float)) or not (-MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
            raise InvalidRequest(f"'{param}' values must be between -100 and 100, got {bias!r} for {key}.",
                                 param=param)
        out[token] = float(bias)
    return out


__all__ = [
    "MAX_LOGIT_BIAS",
    "MAX_LOGIT_BIAS_ENTRIES",
    "PENALTY_RANGE",
    "logit_bias",
    "ollama_format",
    "openai_response_format",
    "penalty",
    "repeat_penalty",
    "responses_text_format",
]
