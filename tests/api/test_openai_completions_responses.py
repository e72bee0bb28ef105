"""`POST /v1/completions` (legacy) and `POST /v1/responses` end to end in one process, on
the simulated runner of `test_openai_routes`, plus the official SDK against both."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from skulk.shared.types.commands import CancelCommand, GenerateText, TaskFinished
from tests.api.test_openai_routes import HANG_GUARD_S, MODEL, assert_openai_error, client, make, sse, until


def sse_events(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of each named SSE event."""
    events = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in lines:
            events.append((lines.get("event"), json.loads(lines["data"])))
    return events


# ---------------------------------------------------------------------------------------
# /v1/completions
# ---------------------------------------------------------------------------------------


async def test_completion_non_streaming_sends_the_raw_prompt():
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "Once", "temperature": 0,
                                                             "top_p": 0.5, "seed": 7, "stop": "\n"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["id"] == f"cmpl-{cluster.command_id}"
    assert body["choices"] == [{"text": "Hello", "index": 0, "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0}}
    params = cluster.params_of(GenerateText)[0]
    assert (params.prompt, params.messages, params.max_tokens) == ("Once", [], 16)  # OpenAI's default
    assert (params.temperature, params.top_p, params.seed, params.stop) == (0.0, 0.5, 7, ["\n"])
    await until(lambda: len(cluster.of(TaskFinished)) == 1)
    assert cluster.of(CancelCommand) == []


async def test_completion_prompt_list_of_one_and_length_finish():
    app, cluster = make(finish="length")
    async with client(app) as http:
        response = await http.post("/v1/completions", json={"model": MODEL, "prompt": ["Once"], "max_tokens": 2})
    assert response.json()["choices"][0]["finish_reason"] == "length"
    assert cluster.params_of(GenerateText)[0].prompt == "Once"


async def test_completion_streaming():
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "Once", "stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse(response.text)
    assert events[-1] == "[DONE]"
    *chunks, last, _ = events
    assert all(c["object"] == "text_completion" and c["id"] == f"cmpl-{cluster.command_id}" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello"
    assert last["choices"][0]["finish_reason"] == "stop" and last["usage"]["total_tokens"] == 5
    await until(lambda: len(cluster.of(TaskFinished)) == 1)


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"prompt": []}, "prompt"), ({"prompt": ["a"] * 5, "n": 2}, "prompt"),
     ({"prompt": None}, "prompt"), ({"n": 9}, "n"), ({"temperature": 5}, "temperature"),
     ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 4096}, "max_tokens"),
     ({"suffix": "end"}, "suffix"), ({"prompt": 5}, "prompt")],
)
async def test_completion_bad_parameters_are_400s(fields, param):
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x", **fields})
    assert_openai_error(response, 400, type="invalid_request_error", param=param)
    assert cluster.commands == []


async def test_completion_unplaced_model_is_a_404():
    app, _ = make()
    async with client(app) as http:
        response = await http.post("/v1/completions", json={"model": "acme/none", "prompt": "x"})
    assert_openai_error(response, 404, code="model_not_found")


async def test_completion_stream_failure_is_an_error_event():
    app, _ = make("fail")
    async with client(app) as http:
        response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stream": True})
    events = sse(response.text)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "RunnerCrashed"


# ---------------------------------------------------------------------------------------
# /v1/responses
# ---------------------------------------------------------------------------------------


async def test_response_non_streaming():
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/responses", json={
            "model": MODEL, "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.5,
            "input": [{"role": "user", "content": "hi"},
                      {"role": "assistant", "content": [{"type": "output_text", "text": "yo"}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "more"}]}]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == f"resp_{cluster.command_id}" and body["object"] == "response"
    assert body["status"] == "completed" and body["incomplete_details"] is None
    [item] = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert item["content"] == [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}]
    assert {k: body["usage"][k] for k in ("input_tokens", "output_tokens", "total_tokens")} == {
        "input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    params = cluster.params_of(GenerateText)[0]
    assert [(m.role, m.content) for m in params.messages] == [
        ("system", "Be brief."), ("user", "hi"), ("assistant", "yo"), ("user", "more")]
    assert (params.max_tokens, params.temperature) == (9, 0.5)
    await until(lambda: len(cluster.of(TaskFinished)) == 1)


async def test_response_cut_by_length_is_incomplete():
    app, _ = make(finish="length")
    async with client(app) as http:
        body = (await http.post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 2})).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_response_streaming_event_sequence():
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", "stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    names = [name for name, _ in events]
    assert names == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"]
    assert all(data["type"] == name for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert "".join(d["delta"] for n, d in events if n == "response.output_text.delta") == "Hello"
    done = events[-1][1]["response"]
    assert done["id"] == f"resp_{cluster.command_id}" and done["status"] == "completed"
    assert done["output"][0]["content"][0]["text"] == "Hello" and done["usage"]["total_tokens"] == 5
    assert "[DONE]" not in response.text


async def test_response_stream_failure_ends_with_response_failed():
    app, _ = make("fail")
    async with client(app) as http:
        response = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", "stream": True})
    events = sse_events(response.text)
    assert [n for n, _ in events][-2:] == ["error", "response.failed"]
    assert events[-2][1]["code"] == "RunnerCrashed"
    assert events[-1][1]["response"]["status"] == "failed"


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
     ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]}, "input[0].content[0].type"),
     ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].image_url"),
     ({"input": [{"type": "web_search_call", "id": "c"}]}, "input[0].type"),
     ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
     ({"tools": [{"type": "web_search"}]}, "tools[0].type"), ({"tool_choice": "sometimes"}, "tool_choice"),
     ({"input": []}, "input"), ({"max_output_tokens": 4096}, "max_output_tokens"), ({"top_p": 2}, "top_p")],
)
async def test_response_bad_parameters_are_400s(fields, param):
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/responses", json={"model": MODEL, "input": "hi", **fields})
    assert_openai_error(response, 400, type="invalid_request_error", param=param)
    assert cluster.commands == []


# ---------------------------------------------------------------------------------------
# The official SDK
# ---------------------------------------------------------------------------------------


async def test_official_sdk_completions_and_responses():
    openai = pytest.importorskip("openai")
    app, _ = make()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://skulk")
    sdk = openai.AsyncOpenAI(base_url="http://skulk/v1", api_key="unused", http_client=http, max_retries=0)
    try:
        completion = await sdk.completions.create(model=MODEL, prompt="Once", max_tokens=4)
        assert completion.choices[0].text == "Hello" and completion.choices[0].finish_reason == "stop"
        assert completion.usage.total_tokens == 5

        stream = await sdk.completions.create(model=MODEL, prompt="Once", stream=True)
        text = ""
        async for chunk in stream:
            text += chunk.choices[0].text if chunk.choices else ""
        assert text == "Hello"

        response = await sdk.responses.create(model=MODEL, input="hi", instructions="Be brief.",
                                              max_output_tokens=8)
        assert response.output_text == "Hello" and response.status == "completed"
        assert response.usage.output_tokens == 2

        events = [event async for event in await sdk.responses.create(model=MODEL, input="hi", stream=True)]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello"
        assert events[-1].response.output_text == "Hello"

        async with sdk.responses.stream(model=MODEL, input="hi") as managed:
            final = await managed.get_final_response()
        assert final.output_text == "Hello"

        with pytest.raises(openai.BadRequestError):
            await sdk.completions.create(model=MODEL, prompt="x", n=9)
        with pytest.raises(openai.NotFoundError):
            await sdk.responses.create(model="acme/none", input="hi")
    finally:
        await sdk.close()


@pytest.mark.parametrize(("path", "body", "prefix"), [
    ("/v1/completions", {"model": MODEL, "prompt": "x"}, "cmpl-"),
    ("/v1/responses", {"model": MODEL, "input": "x"}, "resp_"),
])
async def test_cancel_takes_the_response_ids(path, body, prefix):
    app, cluster = make("hang")
    async with client(app) as http:
        pending = asyncio.create_task(http.post(path, json=body))
        await until(lambda: bool(cluster.commands) and cluster.streams.stats()["deliveredFrames"] == 3)
        cancel = await http.post(f"/v1/cancel/{prefix}{cluster.command_id}")
        response = await asyncio.wait_for(pending, timeout=HANG_GUARD_S)
    assert cancel.status_code == 200 and cancel.json()["commandId"] == cluster.command_id
    assert_openai_error(response, 499, code="cancelled")
