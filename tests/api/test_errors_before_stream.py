"""A streamed request that fails before any output (the runner found the prompt longer
than the context) is answered with an HTTP error in the caller's shape before the stream
starts, never a 200 and then an error event; OpenAI's code is `context_length_exceeded`."""

from __future__ import annotations

import anthropic
import ollama
import openai
import pytest

from tests.api.scripted_cluster import asgi_http, scripted_app
from tests.api.test_openai_routes import MODEL
from tests.api.test_tools_sdk import anthropic_sdk, ollama_sdk, openai_sdk

TOO_LONG = ("ContextLengthExceeded", "This model's maximum context length is 2048 tokens, but the prompt is 3000 "
                                     "tokens and must leave room for at least one generated token.")
ASK = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"model": MODEL, "messages": ASK, "stream": True}),
    ("/v1/completions", {"model": MODEL, "prompt": "hi", "stream": True}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}),
])
async def test_openai_streams_answer_400_before_any_byte(path, body):
    app, _ = scripted_app(fail=TOO_LONG)
    async with asgi_http(app) as http:
        reply = await http.post(path, json=body)
    assert reply.status_code == 400 and reply.headers["content-type"].startswith("application/json")
    assert reply.json()["error"]["code"] == "context_length_exceeded"
    assert "2048" in reply.json()["error"]["message"]


async def test_the_openai_sdk_raises_at_create():
    app, _ = scripted_app(fail=TOO_LONG)
    with pytest.raises(openai.BadRequestError) as caught:
        await openai_sdk(app).chat.completions.create(model=MODEL, messages=ASK, stream=True)
    assert caught.value.code == "context_length_exceeded"


async def test_anthropic_and_ollama_streams_answer_400_in_their_shape():
    app, _ = scripted_app(fail=TOO_LONG)
    with pytest.raises(anthropic.BadRequestError) as caught:
        async with anthropic_sdk(app).messages.stream(model=MODEL, max_tokens=8, messages=ASK) as stream:
            await stream.get_final_message()
    assert caught.value.status_code == 400

    with pytest.raises(ollama.ResponseError) as failed:
        async for _ in await ollama_sdk(app).chat(model=MODEL, messages=ASK, stream=True):
            pass
    assert failed.value.status_code == 400 and "2048" in failed.value.error


async def test_a_failure_after_output_still_ends_the_stream_with_an_error_event():
    app, _ = scripted_app(["Hel", "lo"], finish=None, fail=("EngineError", "boom"), fail_after_output=True)
    async with asgi_http(app) as http:
        reply = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK, "stream": True})
    assert reply.status_code == 200
    assert '"content":"Hel"' in reply.text and '"message":"boom"' in reply.text
