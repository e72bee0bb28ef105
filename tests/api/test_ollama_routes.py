"""The Ollama routes under /ollama end to end inside one process, on the simulated runner of
`test_openai_routes` (a hand-built ApiContext whose `submit_command` delivers frames)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from skulk.api.streams import CommandStreams
from skulk.models.cards import builtin_cards_dir, load_card
from skulk.shared.types.commands import CancelCommand, GenerateText, TaskFinished
from tests.api.test_openai_routes import HANG_GUARD_S, MODEL, AsgiCall, client, make, until

CARD = load_card(builtin_cards_dir() / "local--tiny-llama.toml")
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
GENERATE = {"model": MODEL, "prompt": "hi"}


def make_ollama(runner: str = "complete", **kwargs):
    return make(runner, get_cards=lambda: {MODEL: CARD}, **kwargs)


def lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def assert_ollama_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    return body["error"]


async def test_chat_streams_ndjson_by_default():
    app, cluster = make_ollama()
    async with client(app) as http:
        response = await http.post("/ollama/api/chat", json={
            **CHAT, "options": {"temperature": 0.2, "top_p": 0.9, "top_k": 4, "seed": 7, "num_predict": 9,
                                "stop": ["###"], "num_ctx": 4096}})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/x-ndjson")
    *parts, final = lines(response.text)
    assert [p["message"] for p in parts] == [{"role": "assistant", "content": "Hel"},
                                             {"role": "assistant", "content": "lo"}]
    assert all(p["done"] is False and p["model"] == MODEL for p in parts)
    assert final["done"] is True and final["done_reason"] == "stop"
    assert (final["prompt_eval_count"], final["eval_count"]) == (3, 2)
    assert all(isinstance(final[k], int) and final[k] >= 0 for k in
               ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"))
    params = cluster.params_of(GenerateText)[0]
    assert (params.temperature, params.top_p, params.top_k, params.seed, params.max_tokens, params.stop) == (
        0.2, 0.9, 4, 7, 9, ["###"])
    assert params.stream is True
    await until(lambda: len(cluster.of(TaskFinished)) == 1)
    assert cluster.of(CancelCommand) == []


async def test_chat_non_streaming():
    app, cluster = make_ollama()
    async with client(app) as http:
        response = await http.post("/ollama/api/chat", json={**CHAT, "stream": False})
    body = response.json()
    assert body["message"] == {"role": "assistant", "content": "Hello"}
    assert body["done"] is True and body["done_reason"] == "stop" and body["eval_count"] == 2
    await until(lambda: len(cluster.of(TaskFinished)) == 1)


@pytest.mark.parametrize("stream", [True, False])
async def test_generate_with_length_done_reason(stream):
    app, cluster = make_ollama(finish="length")
    async with client(app) as http:
        response = await http.post("/ollama/api/generate", json={**GENERATE, "system": "Be brief.", "stream": stream})
    final = lines(response.text)[-1] if stream else response.json()
    assert final["done_reason"] == "length"
    if stream:
        assert "".join(p["response"] for p in lines(response.text)) == "Hello"
    else:
        assert final["response"] == "Hello"
    params = cluster.params_of(GenerateText)[0]
    assert [(m.role, m.content) for m in params.messages] == [("system", "Be brief."), ("user", "hi")]


async def test_raw_generate_sends_the_prompt_as_is():
    app, cluster = make_ollama()
    async with client(app) as http:
        await http.post("/ollama/api/generate", json={**GENERATE, "raw": True, "stream": False})
    params = cluster.params_of(GenerateText)[0]
    assert params.prompt == "hi" and params.messages == []


async def test_empty_prompt_only_loads():
    app, cluster = make_ollama()
    async with client(app) as http:
        response = await http.post("/ollama/api/generate", json={"model": MODEL})
        missing = await http.post("/ollama/api/generate", json={"model": "acme/unplaced"})
    assert response.json()["done_reason"] == "load" and response.json()["done"] is True
    assert_ollama_error(missing, 404)
    assert cluster.commands == []


@pytest.mark.parametrize(
    ("path", "content", "status"),
    [("/ollama/api/chat", b'{"model": ', 400), ("/ollama/api/chat", b"[1]", 400),
     ("/ollama/api/chat", json.dumps({**CHAT, "options": {"temperature": -1}}).encode(), 400),
     ("/ollama/api/chat", json.dumps({**CHAT, "options": {"num_predict": 4096}}).encode(), 400),
     ("/ollama/api/chat", json.dumps({**CHAT, "model": "acme/unplaced"}).encode(), 404),
     ("/ollama/api/generate", json.dumps({"prompt": "hi"}).encode(), 400),
     ("/ollama/api/show", json.dumps({"model": "acme/unplaced"}).encode(), 404),
     ("/ollama/api/nope", b"{}", 404)],
    ids=["truncated", "array", "temperature", "num-predict-over-context", "unplaced", "no-model", "show-unplaced",
         "unknown-route"],
)
async def test_errors_are_ollama_shaped(path, content, status):
    app, cluster = make_ollama()
    async with client(app) as http:
        response = await http.post(path, content=content, headers={"content-type": "application/json"})
    message = assert_ollama_error(response, status)
    if "unplaced" in content.decode():
        assert 'POST /place_instance {"modelId": "acme/unplaced"}' in message
    assert cluster.commands == []


async def test_overloaded_is_a_503():
    app, cluster = make_ollama("silent", streams=CommandStreams(max_open_streams=1))
    async with client(app) as http:
        first = asyncio.create_task(http.post("/ollama/api/chat", json={**CHAT, "stream": False}))
        await until(lambda: cluster.streams.stats()["openStreams"] == 1)
        second = await http.post("/ollama/api/chat", json=CHAT)
        cluster.streams.fail_all("MasterFailover", "test over")
        await first
    assert_ollama_error(second, 503)


async def test_runner_failure_ends_the_stream_with_an_error_line():
    app, _ = make_ollama("fail")
    async with client(app) as http:
        streamed = await http.post("/ollama/api/chat", json=CHAT)
        plain = await http.post("/ollama/api/chat", json={**CHAT, "stream": False})
    assert lines(streamed.text)[-1] == {"error": "the runner died"}
    assert assert_ollama_error(plain, 500) == "the runner died"


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
async def test_client_disconnect_cancels_the_command_once(stream):
    app, cluster = make_ollama("hang")
    call = AsgiCall(app, {**CHAT, "stream": stream}, "2.4", path="/ollama/api/chat")
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


async def test_listings_version_and_liveness():
    app, _ = make_ollama()
    async with client(app) as http:
        tags = (await http.get("/ollama/api/tags")).json()
        ps = (await http.get("/ollama/api/ps")).json()
        shown = (await http.post("/ollama/api/show", json={"model": MODEL})).json()
        version = (await http.get("/ollama/api/version")).json()
        root = await http.get("/ollama")
        slash = await http.get("/ollama/")
        head = await http.head("/ollama")
    [tag] = tags["models"]
    assert (tag["name"], tag["model"], tag["size"]) == (MODEL, MODEL, CARD.storage_size_bytes)
    assert tag["details"]["family"] == CARD.family and tag["details"]["quantization_level"] == CARD.quantization
    [running] = ps["models"]
    assert (running["name"], running["context_length"], running["size"]) == (MODEL, 2048, CARD.storage_size_bytes)
    assert shown["details"]["format"] == CARD.artifact_format and "completion" in shown["capabilities"]
    assert isinstance(version["version"], str)
    assert root.text == slash.text == "Ollama is running" and head.status_code == 200


# ---------------------------------------------------------------------------------------
# The official client, unchanged
# ---------------------------------------------------------------------------------------


async def test_official_ollama_client():
    ollama = pytest.importorskip("ollama")
    app, _ = make_ollama()
    sdk = ollama.AsyncClient(host="http://skulk/ollama", transport=httpx.ASGITransport(app=app))

    reply = await sdk.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], options={"temperature": 0})
    assert reply.message.content == "Hello" and reply.done_reason == "stop" and reply.eval_count == 2

    parts = [part async for part in await sdk.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                   stream=True)]
    assert "".join(p.message.content for p in parts) == "Hello" and parts[-1].done

    generated = await sdk.generate(model=MODEL, prompt="hi")
    assert generated.response == "Hello" and generated.prompt_eval_count == 3

    pieces = [part async for part in await sdk.generate(model=MODEL, prompt="hi", stream=True)]
    assert "".join(p.response for p in pieces) == "Hello" and pieces[-1].done_reason == "stop"

    listing = await sdk.list()
    assert [m.model for m in listing.models] == [MODEL] and listing.models[0].size == CARD.storage_size_bytes
    running = await sdk.ps()
    assert running.models[0].context_length == 2048
    shown = await sdk.show(MODEL)
    assert shown.details.family == CARD.family and shown.modelinfo["general.architecture"] == CARD.family

    with pytest.raises(ollama.ResponseError) as missing:
        await sdk.chat(model="acme/unplaced", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.status_code == 404 and "place_instance" in missing.value.error


async def test_official_ollama_client_sees_a_stream_error():
    ollama = pytest.importorskip("ollama")
    app, _ = make_ollama("fail")
    sdk = ollama.AsyncClient(host="http://skulk/ollama", transport=httpx.ASGITransport(app=app))
    with pytest.raises(ollama.ResponseError, match="the runner died"):
        async for _ in await sdk.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True):
            pass


def test_official_sync_ollama_client_over_a_real_socket():
    ollama = pytest.importorskip("ollama")
    from tests.api.live_server import live_server

    app, _ = make_ollama()
    with live_server(app) as base_url:
        assert httpx.head(f"{base_url}/ollama").status_code == 200
        sdk = ollama.Client(host=f"{base_url}/ollama")
        assert sdk.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}]).message.content == "Hello"
        parts = list(sdk.generate(model=MODEL, prompt="hi", stream=True))
        assert "".join(p.response for p in parts) == "Hello" and parts[-1].done
        assert [m.model for m in sdk.list().models] == [MODEL]
        assert sdk.ps().models[0].context_length == 2048
        assert sdk.show(MODEL).details.family == CARD.family


async def test_a_model_whose_only_runner_failed_is_a_503_at_once():
    from tests.api.test_openai_routes import FAILED_STATE

    app, cluster = make_ollama(state=FAILED_STATE)
    async with client(app) as http:
        response = await http.post("/ollama/api/chat", json={**CHAT, "stream": False})
    assert "runner r1 on node n1 is Failed (engine crashed)" in assert_ollama_error(response, 503)
    assert cluster.commands == []
