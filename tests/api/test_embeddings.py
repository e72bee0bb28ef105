"""Embeddings on the OpenAI and Ollama surfaces: request normalisation and response shapes
as units, then the routes in-process with the official SDKs (the scripted runner answers
RunWorkload with fixed vectors)."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest

from skulk.api.adapters.openai_embeddings import (
    MAX_EMBEDDING_INPUTS,
    EmbeddingRequest,
    embedding_response,
    encode_vector,
    to_params,
)
from skulk.api.errors import InvalidRequest
from skulk.shared.types.commands import CancelCommand, RunWorkload, TaskFinished
from skulk.shared.types.common import Usage
from tests.api.scripted_cluster import asgi_http, scripted_app
from tests.api.test_openai_routes import MODEL, until
from tests.api.test_tools_sdk import ollama_sdk, openai_sdk

VECTORS = [[0.6, 0.8, 0.0], [0.0, 0.0, 1.0]]


@pytest.mark.parametrize(
    ("input_", "inputs"),
    [("hello", ["hello"]), (["a", "b"], ["a", "b"])],
)
def test_inputs_normalise(input_, inputs):
    params = to_params(EmbeddingRequest(model=MODEL, input=input_, dimensions=2))
    assert (params.model_id, params.inputs, params.dimensions) == (MODEL, inputs, 2)


@pytest.mark.parametrize(
    ("input_", "token_inputs"),
    [([1, 2, 3], [[1, 2, 3]]), ([[1, 2], [3]], [[1, 2], [3]])],
)
def test_token_arrays_normalise(input_, token_inputs):
    params = to_params(EmbeddingRequest(model=MODEL, input=input_))
    assert (params.inputs, params.token_inputs, params.embedding_inputs) == ([], token_inputs, token_inputs)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [[]]}, "input[0]"),
        ({"input": [[1, 2], [-1]]}, "input[1]"),
        ({"input": [2**31]}, "input[0]"),
        ({"input": ["ok", ""]}, "input[1]"),
        ({"input": ["x"] * (MAX_EMBEDDING_INPUTS + 1)}, "input"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"input": "x", "model": " "}, "model"),
    ],
)
def test_bad_requests_name_their_parameter(body, param):
    with pytest.raises(InvalidRequest) as caught:
        to_params(EmbeddingRequest(**{"model": MODEL, **body}))
    assert caught.value.param == param


def test_base64_is_little_endian_float32():
    encoded = encode_vector([0.5, -1.0], "base64")
    assert np.frombuffer(base64.b64decode(encoded), dtype="<f4").tolist() == [0.5, -1.0]
    assert encode_vector([0.5], "float") == [0.5]


def test_response_shape():
    body = embedding_response(VECTORS, Usage(prompt_tokens=4, total_tokens=4), model=MODEL, encoding_format="float")
    assert body == {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": VECTORS[0]},
                 {"object": "embedding", "index": 1, "embedding": VECTORS[1]}],
        "model": MODEL,
        "usage": {"prompt_tokens": 4, "total_tokens": 4},
    }


@pytest.mark.parametrize("encoding_format", ["float", "base64", None])
async def test_openai_sdk_embeddings(encoding_format):
    # The SDK asks for base64 when no format is given, and decodes it itself.
    app, cluster = scripted_app(vectors=VECTORS)
    extra = {} if encoding_format is None else {"encoding_format": encoding_format}
    reply = await openai_sdk(app).embeddings.create(model=MODEL, input=["one two", "three"], dimensions=3, **extra)
    got = reply.data[0].embedding
    if encoding_format == "base64":
        got = np.frombuffer(base64.b64decode(got), dtype="<f4").tolist()
    assert got == pytest.approx(VECTORS[0], abs=1e-6)
    assert [d.index for d in reply.data] == [0, 1]
    assert reply.usage.prompt_tokens == 3
    (command,) = [c for c in cluster.commands if isinstance(c, RunWorkload)]
    sent = cluster.inputs[command.command_id].params
    assert (sent.inputs, sent.dimensions) == (["one two", "three"], 3)
    assert command.params.inputs == ["", ""]  # the master sees no text
    await until(lambda: any(isinstance(c, TaskFinished) for c in cluster.commands))
    assert not any(isinstance(c, CancelCommand) for c in cluster.commands)


async def test_unplaced_model_is_404_in_openai_shape():
    app, _ = scripted_app(vectors=VECTORS)
    async with asgi_http(app) as http:
        response = await http.post("/v1/embeddings", json={"model": "not/placed", "input": "x"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("error_type", "status"),
    [("InvalidRequest", 400), ("ContextLengthExceeded", 400), ("EmbeddingFailed", 500)],
)
async def test_runner_failures_keep_the_openai_shape(error_type, status):
    app, _cluster = scripted_app(fail=(error_type, "it went wrong"))
    with pytest.raises(openai.APIStatusError) as caught:
        await openai_sdk(app).embeddings.create(model=MODEL, input="x", encoding_format="float")
    assert caught.value.status_code == status
    assert "it went wrong" in caught.value.message


async def test_token_arrays_reach_the_runner_and_are_answered_per_input():
    app, cluster = scripted_app(vectors=VECTORS)
    reply = await openai_sdk(app).embeddings.create(model=MODEL, input=[[1, 2], [3]], encoding_format="float")
    assert [d.embedding for d in reply.data] == VECTORS
    params = cluster.params(RunWorkload)
    assert (params.inputs, params.token_inputs) == ([], [[1, 2], [3]])


async def test_a_runner_answering_too_few_vectors_is_not_a_short_success():
    app, _ = scripted_app(vectors=VECTORS[:1])
    with pytest.raises(openai.APIStatusError) as caught:
        await openai_sdk(app).embeddings.create(model=MODEL, input=["one", "two"], encoding_format="float")
    assert caught.value.status_code == 502


async def test_ollama_embed_and_legacy_embeddings():
    app, _cluster = scripted_app(vectors=VECTORS)
    reply = await ollama_sdk(app).embed(model=MODEL, input=["one", "two"])
    assert reply.embeddings == VECTORS
    assert reply.prompt_eval_count == 2
    app, _ = scripted_app(vectors=VECTORS[:1])
    legacy = await ollama_sdk(app).embeddings(model=MODEL, prompt="one")
    assert legacy.embedding == VECTORS[0]


async def test_ollama_embed_errors_are_ollama_shaped():
    app, _ = scripted_app(vectors=VECTORS)
    async with asgi_http(app) as http:
        missing = await http.post("/ollama/api/embed", json={"model": "not/placed", "input": "x"})
        empty = await http.post("/ollama/api/embed", json={"model": MODEL, "input": []})
    assert missing.status_code == 404 and set(missing.json()) == {"error"}
    assert empty.status_code == 400 and "input" in empty.json()["error"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "seed": 10**30}, "seed"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_k": 2**64}, "top_k"),
        ("/v1/embeddings", {"input": "x", "dimensions": 10**30}, "dimensions"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"maximum": 10**30}}}]}, None),
    ],
)
async def test_integers_the_cluster_cannot_carry_are_the_callers_400(path, body, param):
    # Found by the schema fuzz: msgpack frames at most 64-bit integers, and a failure to frame
    # the command used to read as an unreachable master (503).
    app, _ = scripted_app(["a"], vectors=VECTORS)
    async with asgi_http(app) as http:
        response = await http.post(path, json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
