"""The Anthropic Messages route end to end inside one process, on the simulated runner of
`test_openai_routes` (a hand-built ApiContext whose `submit_command` delivers frames)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from skulk.api.adapters.anthropic import stop_reason
from skulk.api.streams import CommandStreams
from skulk.shared.types.commands import CancelCommand, GenerateText, TaskFinished
from tests.api.test_openai_routes import HANG_GUARD_S, MODEL, AsgiCall, client, make, until

BODY = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def events(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event."""
    out = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def assert_anthropic_error(response: httpx.Response, status: int, error_type: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == error_type, body
    return body["error"]["message"]


async def test_non_streaming_message():
    app, cluster = make()
    request = {**BODY, "system": [{"type": "text", "text": "Be brief."}], "temperature": 0.5, "top_k": 5,
               "stop_sequences": ["\n\n"],
               "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]}
    async with client(app) as http:
        response = await http.post("/v1/messages", json=request)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "id": f"msg_{cluster.command_id}", "type": "message", "role": "assistant", "model": MODEL,
        "content": [{"type": "text", "text": "Hello"}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                  "output_tokens": 2},
    }
    params = cluster.params_of(GenerateText)[0]
    assert [(m.role, m.content) for m in params.messages] == [
        ("system", "Be brief."), ("user", "hi"), ("assistant", "hello"), ("user", "again")]
    assert (params.max_tokens, params.temperature, params.top_k, params.stop) == (16, 0.5, 5, ["\n\n"])
    await until(lambda: len(cluster.of(TaskFinished)) == 1)
    assert cluster.of(CancelCommand) == []


async def test_streaming_message_event_sequence():
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/messages", json={**BODY, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    seen = events(response.text)
    assert [name for name, _ in seen] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in seen)
    assert seen[0][1]["message"]["id"] == f"msg_{cluster.command_id}"
    assert "".join(d["delta"]["text"] for n, d in seen if n == "content_block_delta") == "Hello"
    assert seen[6][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert seen[6][1]["usage"]["output_tokens"] == 2
    await until(lambda: len(cluster.of(TaskFinished)) == 1)


@pytest.mark.parametrize("stream", [False, True])
async def test_length_maps_to_max_tokens(stream):
    app, _ = make(finish="length")
    async with client(app) as http:
        response = await http.post("/v1/messages", json={**BODY, "stream": stream})
    reason = (events(response.text)[6][1]["delta"] if stream else response.json())["stop_reason"]
    assert reason == "max_tokens"


@pytest.mark.parametrize(
    ("finish", "matched", "stops", "expected"),
    [("length", None, [], ("max_tokens", None)), ("stop", None, [], ("end_turn", None)),
     ("stop", "###", ["###"], ("stop_sequence", "###")), ("stop", None, ["###"], ("end_turn", None)),
     ("stop", "###", ["END"], ("end_turn", None)),  # not the request's: never reported as one
     (None, None, [], ("end_turn", None)), ("length", None, ["###"], ("max_tokens", None))],
)
def test_stop_reason_rules(finish, matched, stops, expected):
    assert stop_reason(finish, matched, stops) == expected


@pytest.mark.parametrize(
    ("content", "param_hint"),
    [(b'{"model": ', "JSON"), (b"[1]", "JSON"), (json.dumps({k: v for k, v in BODY.items() if k != "max_tokens"}).encode(),
                                                "max_tokens"),
     (json.dumps({**BODY, "temperature": 1.5}).encode(), "temperature"),
     (json.dumps({**BODY, "messages": [{"role": "system", "content": "x"}]}).encode(), "role"),
     (json.dumps({**BODY, "messages": [{"role": "user", "content": [{"type": "image"}]}]}).encode(), "image")],
    ids=["truncated", "array", "missing-max-tokens", "temperature", "bad-role", "image-block"],
)
async def test_bad_requests_are_anthropic_400s(content, param_hint):
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/messages", content=content, headers={"content-type": "application/json"})
    message = assert_anthropic_error(response, 400, "invalid_request_error")
    assert param_hint in message
    assert cluster.commands == []


async def test_unplaced_model_is_a_not_found_error_naming_the_fix():
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/messages", json={**BODY, "model": "acme/unplaced"})
    message = assert_anthropic_error(response, 404, "not_found_error")
    assert 'POST /place_instance {"modelId": "acme/unplaced"}' in message
    assert cluster.commands == []


async def test_wrong_method_speaks_anthropic():
    app, _ = make()
    async with client(app) as http:
        response = await http.get("/v1/messages")
    assert_anthropic_error(response, 405, "invalid_request_error")


async def test_overloaded_is_an_overloaded_error():
    app, cluster = make("silent", streams=CommandStreams(max_open_streams=1))
    async with client(app) as http:
        first = asyncio.create_task(http.post("/v1/messages", json=BODY))
        await until(lambda: cluster.streams.stats()["openStreams"] == 1)
        second = await http.post("/v1/messages", json=BODY)
        cluster.streams.fail_all("MasterFailover", "test over")
        await first
    assert_anthropic_error(second, 529, "overloaded_error")
    assert second.headers["retry-after"] == "1"


async def test_runner_failure_is_an_api_error():
    app, _cluster = make("fail")
    async with client(app) as http:
        plain = await http.post("/v1/messages", json=BODY)
        streamed = await http.post("/v1/messages", json={**BODY, "stream": True})
    assert assert_anthropic_error(plain, 500, "api_error") == "the runner died"
    last = events(streamed.text)[-1]
    assert last == ("error", {"type": "error", "error": {"type": "api_error", "message": "the runner died"}})


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
async def test_client_disconnect_cancels_the_command_once(stream):
    app, cluster = make("hang")
    call = AsgiCall(app, {**BODY, "stream": stream}, "2.4", path="/v1/messages")
    running = asyncio.create_task(call())
    if stream:
        await until(lambda: "Hel" in call.body_text)
    else:
        await until(lambda: cluster.streams.stats()["deliveredFrames"] == 3)
    call.gone.set()
    await asyncio.wait_for(running, timeout=HANG_GUARD_S)
    await until(lambda: len(cluster.of(CancelCommand)) == 1)
    assert cluster.of(CancelCommand)[0].cancelled_command_id == cluster.command_id
    await asyncio.sleep(0.01)
    assert len(cluster.of(CancelCommand)) == 1 and cluster.of(TaskFinished) == []


# ---------------------------------------------------------------------------------------
# The official SDK, unchanged
# ---------------------------------------------------------------------------------------


def sdk(app):
    anthropic = pytest.importorskip("anthropic")
    # Recent SDKs ship on `httpx2` and refuse `httpx` objects; older ones take `httpx`.
    transport_lib = httpx
    if "httpx2" in anthropic._base_client.__dict__ or hasattr(anthropic._base_client, "_reject_httpx_object"):
        transport_lib = pytest.importorskip("httpx2")
    http = transport_lib.AsyncClient(transport=transport_lib.ASGITransport(app=app), base_url="http://skulk")
    return anthropic, anthropic.AsyncAnthropic(base_url="http://skulk", api_key="unused", http_client=http,
                                               max_retries=0)


async def test_official_anthropic_sdk():
    app, _ = make()
    anthropic, client_ = sdk(app)
    try:
        message = await client_.messages.create(model=MODEL, max_tokens=8, system="Be brief.",
                                                messages=[{"role": "user", "content": "hi"}])
        assert message.content[0].text == "Hello" and message.stop_reason == "end_turn"
        assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 2)

        async with client_.messages.stream(model=MODEL, max_tokens=8,
                                           messages=[{"role": "user", "content": "hi"}]) as stream:
            text = "".join([piece async for piece in stream.text_stream])
            final = await stream.get_final_message()
        assert text == "Hello"
        assert final.stop_reason == "end_turn" and final.usage.output_tokens == 2

        with pytest.raises(anthropic.NotFoundError, match="place_instance"):
            await client_.messages.create(model="acme/unplaced", max_tokens=8,
                                          messages=[{"role": "user", "content": "hi"}])
        with pytest.raises(anthropic.BadRequestError, match="temperature"):
            # Recent SDKs no longer take sampling parameters as arguments; older clients send them.
            await client_.messages.create(model=MODEL, max_tokens=8, extra_body={"temperature": 3},
                                          messages=[{"role": "user", "content": "hi"}])
    finally:
        await client_.close()


async def test_official_anthropic_sdk_sees_a_stream_error():
    app, _ = make("fail")
    anthropic, client_ = sdk(app)
    try:
        with pytest.raises(anthropic.APIStatusError, match="the runner died"):
            async with client_.messages.stream(model=MODEL, max_tokens=8,
                                               messages=[{"role": "user", "content": "hi"}]) as stream:
                async for _ in stream.text_stream:
                    pass
    finally:
        await client_.close()


def test_official_sync_anthropic_sdk_over_a_real_socket():
    anthropic = pytest.importorskip("anthropic")
    from tests.api.live_server import live_server

    app, _ = make()
    with live_server(app) as base_url:
        client_ = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0)
        try:
            message = client_.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
            assert message.content[0].text == "Hello"
            with client_.messages.stream(model=MODEL, max_tokens=8,
                                         messages=[{"role": "user", "content": "hi"}]) as stream:
                assert "".join(stream.text_stream) == "Hello"
                assert stream.get_final_message().usage.output_tokens == 2
        finally:
            client_.close()


async def test_a_model_whose_only_runner_failed_is_a_503_at_once():
    from tests.api.test_openai_routes import FAILED_STATE

    app, cluster = make(state=FAILED_STATE)
    async with client(app) as http:
        response = await http.post("/v1/messages", json=BODY)
    message = assert_anthropic_error(response, 503, "api_error")
    assert "runner r1 on node n1 is Failed (engine crashed)" in message
    assert cluster.commands == []
