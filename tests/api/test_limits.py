"""The request bounds of `skulk.api.limits`, as tables (no app, no sockets)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skulk.api.errors import InvalidRequest, PayloadTooLarge
from skulk.api.limits import (
    MAX_ARRAY_OBJECTS,
    MAX_BYTES_PER_TOKEN,
    MAX_EMBEDDING_INPUTS,
    MAX_JSON_DEPTH,
    MAX_MESSAGES,
    MAX_STOP_SEQUENCES,
    MAX_TEXT_CHARS,
    MAX_TOOLS,
    body_size_error,
    context_error,
    declared_length,
    embedding_limits_error,
    generation_limits_error,
    json_value_error,
)
from skulk.shared.types.common import ChatMessage, ToolCall, ToolSpec
from skulk.shared.types.tasks import EmbeddingParams, TextGenerationParams

MODEL = "m"


@pytest.mark.parametrize(
    ("size", "limit", "refused"),
    [(None, 10, False), (0, 10, False), (10, 10, False), (11, 10, True), (50 * 2**20, 8 * 2**20, True)],
)
def test_body_size_error(size, limit, refused):
    error = body_size_error(size, limit)
    assert (error is not None) is refused
    if refused:
        assert isinstance(error, PayloadTooLarge) and error.kind == "too_large" and str(limit) in error.message


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, None), (b"0", 0), (b" 123 ", 123), (b"-1", InvalidRequest), (b"1e3", InvalidRequest), (b"", InvalidRequest)],
)
def test_declared_length(raw, expected):
    value = declared_length(raw)
    if expected is InvalidRequest:
        assert isinstance(value, InvalidRequest)
    else:
        assert value == expected


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"a": "ok", "b": [1, 2.5, {"c": "\\u00e9\\ud83d\\ude00"}]}', None),  # a valid surrogate pair is fine
        (b'{"a": "x\\ud800y"}', "invalid_unicode"),
        (b'{"a": "\\udc00"}', "invalid_unicode"),
        (b'{"\\ud800": 1}', "invalid_unicode"),
        (b'{"a": ["\\ud83d"]}', "invalid_unicode"),  # a high surrogate with no low one
        (b'{"t": NaN}', "invalid_number"),
        (b'{"t": Infinity}', "invalid_number"),
        (b'{"t": -Infinity}', "invalid_number"),
        (b'{"t": 1e999}', "invalid_number"),
        (b'{"t": -1e400}', "invalid_number"),
        (b'{"t": 1e308}', None),
        (b"[" * (MAX_JSON_DEPTH + 2) + b"]" * (MAX_JSON_DEPTH + 2), "too_deep"),
        (b"[" * 100_000 + b"]" * 100_000, "too_deep"),  # past Python's own recursion limit
        (b"not json", None),  # the route's parser explains that one
        (b"\xff\xfe", None),
    ],
)
def test_json_value_error(body, code):
    error = json_value_error(body)
    assert (error.code if error else None) == code
    if error is not None:
        assert error.kind == "invalid_request"


def test_json_arrays_of_objects_are_bounded_and_named():
    body = ('{"messages": [' + ",".join(['{"role": "user", "content": "hi"}'] * (MAX_ARRAY_OBJECTS + 1)) + "]}").encode()
    error = json_value_error(body)
    assert error is not None and error.param == "messages" and error.code == "array_above_max_length"
    ids = ("[" + ",".join(["1"] * (MAX_ARRAY_OBJECTS * 2)) + "]").encode()  # token ids are not objects
    assert json_value_error(ids) is None


def chat(n: int = 1, content: str = "hi", **kwargs) -> TextGenerationParams:
    return TextGenerationParams(model_id=MODEL, messages=[ChatMessage(role="user", content=content)] * n, **kwargs)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        (chat(), None),
        (chat(MAX_MESSAGES), None),
        (chat(MAX_MESSAGES + 1), "messages"),
        (chat(content="x" * MAX_TEXT_CHARS), None),
        (chat(content="x" * (MAX_TEXT_CHARS + 1)), "messages[0].content"),
        (TextGenerationParams(model_id=MODEL, prompt="x" * (MAX_TEXT_CHARS + 1)), "prompt"),
        (chat(tools=[ToolSpec(name="f")] * (MAX_TOOLS + 1)), "tools"),
        (chat(stop=["s"] * (MAX_STOP_SEQUENCES + 1)), "stop"),
        (TextGenerationParams(model_id=MODEL, messages=[
            ChatMessage(role="assistant", tool_calls=[ToolCall(id="1", name="f", arguments="x" * (MAX_TEXT_CHARS + 1))])]),
         "messages[0].tool_calls"),
    ],
)
def test_generation_limits_error(params, param):
    error = generation_limits_error(params)
    assert (error.param if error else None) == param


@pytest.mark.parametrize(
    ("content_bytes", "context", "refused"),
    [
        (MAX_BYTES_PER_TOKEN * 100, 2048, False),
        (MAX_BYTES_PER_TOKEN * 2047, 2048, False),
        (MAX_BYTES_PER_TOKEN * 2048, 2048, True),
        (MAX_BYTES_PER_TOKEN * 2048 + 1, 2048, True),
    ],
)
def test_context_error_is_a_sound_lower_bound(content_bytes, context, refused):
    error = context_error(chat(content="x" * content_bytes), context)
    assert (error is not None) is refused
    if refused:
        assert error.code == "context_length_exceeded" and error.param == "messages"


def test_context_error_counts_utf8_bytes_and_raw_prompts():
    two_byte = "é" * (MAX_BYTES_PER_TOKEN * 16 // 2)  # 16 tokens' worth of bytes at least
    assert context_error(TextGenerationParams(model_id=MODEL, prompt=two_byte), 16).param == "prompt"
    assert context_error(TextGenerationParams(model_id=MODEL, prompt=two_byte), 17) is None


@pytest.mark.parametrize(
    ("params", "param"),
    [
        (EmbeddingParams(model_id=MODEL, inputs=["a"] * MAX_EMBEDDING_INPUTS), None),
        (EmbeddingParams(model_id=MODEL, inputs=["a"] * (MAX_EMBEDDING_INPUTS + 1)), "input"),
        (EmbeddingParams(model_id=MODEL, inputs=["ok", "x" * (MAX_TEXT_CHARS + 1)]), "input[1]"),
        (EmbeddingParams(model_id=MODEL, token_inputs=[[1] * (MAX_TEXT_CHARS + 1)]), "input[0]"),
    ],
)
def test_embedding_limits_error(params, param):
    error = embedding_limits_error(params)
    assert (error.param if error else None) == param


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=256))
def test_json_value_error_never_raises_on_any_bytes(body):
    error = json_value_error(body)
    assert error is None or error.kind == "invalid_request"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES)
def test_every_valid_json_document_passes(value):
    """Valid text (hypothesis' text() never holds lone surrogates) and finite numbers pass."""
    assert json_value_error(json.dumps(value).encode()) is None
