"""Chat middleware on every chat wire, in process on the scripted cluster: the transform
reaches what the runner receives, the observer sees each response exactly once, and a
failing or overrunning transform is skipped or refused (typed, in the caller's shape) by its
extension's policy. Real nodes and the example extension: tests/cluster/test_extensions.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from skulk.api.chat_middleware import embed_in_process, observed
from skulk.api.context import ApiContext
from skulk.extensions.context import ExtensionContext
from skulk.extensions.contract import shape_of
from skulk.extensions.loader import ExtensionSet, LoadedExtension
from skulk.extensions.middleware import ExtensionRuntime
from skulk.extensions.summary import ChatResponseSummary
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.ids import CommandId
from skulk.shared.types.state import State
from skulk.shared.types.tasks import TextGenerationParams
from tests.api.scripted_cluster import asgi_http, scripted_app
from tests.api.test_openai_routes import MODEL, until

STAMP = "Always answer in French."


class Stamp:
    name = "stamp"
    version = "1"
    skulk_versions = ">=0"

    def __init__(self, policy: str = "skip", mode: str = "stamp") -> None:
        self.failure_policy = policy
        self.mode = mode
        self.summaries: list[ChatResponseSummary] = []

    async def transform_chat_request(self, params: TextGenerationParams, ctx: ExtensionContext) -> TextGenerationParams:
        if self.mode == "raise":
            raise RuntimeError("policy backend down")
        if self.mode == "slow":
            await asyncio.sleep(30)
        return params.model_copy(update={"messages": [ChatMessage(role="system", content=STAMP), *params.messages]})

    def observe_chat_response(self, summary: ChatResponseSummary, ctx: ExtensionContext) -> None:
        self.summaries.append(summary)


@contextlib.asynccontextmanager
async def served(ext: Stamp, **scripted: Any) -> AsyncIterator[tuple[Any, Any, ExtensionRuntime]]:
    loaded = LoadedExtension(shape=shape_of(ext), obj=ext, entry_point="stamp = t:make")
    runtime = ExtensionRuntime(
        ExtensionSet(loaded=(loaded,)), ExtensionContext(node_id="n1", node_name="one"), transform_deadline_s=0.2
    )
    app, cluster = scripted_app(["Bon", "jour"], context_fields={"extensions": runtime}, **scripted)
    task = asyncio.create_task(runtime.run(lambda: True))
    try:
        async with asgi_http(app) as http:
            yield http, cluster, runtime
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


USER = [{"role": "user", "content": "hi"}]
REQUESTS = {
    "openai.chat": ("/v1/chat/completions", {"model": MODEL, "messages": USER}),
    "openai.responses": ("/v1/responses", {"model": MODEL, "input": "hi"}),
    "anthropic.messages": ("/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": USER}),
    "ollama.chat": ("/ollama/api/chat", {"model": MODEL, "messages": USER, "stream": False}),
    "ollama.generate": ("/ollama/api/generate", {"model": MODEL, "prompt": "hi", "stream": False}),
}


@pytest.mark.parametrize("wire", sorted(REQUESTS))
@pytest.mark.parametrize("stream", [False, True])
async def test_every_chat_wire_is_transformed_and_observed_once(wire: str, stream: bool) -> None:
    path, body = REQUESTS[wire]
    ext = Stamp()
    async with served(ext) as (http, cluster, runtime):
        response = await http.post(path, json={**body, "stream": stream})
        assert response.status_code == 200, response.text
        sent = cluster.params()
        assert sent.messages[0] == ChatMessage(role="system", content=STAMP)
        assert sent.messages[-1].content == "hi"
        await until(lambda: len(ext.summaries) >= 1)
        extra = await http.get("/v1/models")  # one more round trip: a second summary would be queued by now
        assert extra.status_code == 200 and runtime.stats()["observerQueue"]["depth"] == 0
    [summary] = ext.summaries
    assert (summary.wire, summary.text, summary.finish_reason, summary.model_id, summary.error) == (
        wire,
        "Bonjour",
        "stop",
        MODEL,
        None,
    )
    assert summary.request_id == cluster.commands[0].command_id


async def test_a_skip_policy_transform_that_raises_or_overruns_is_skipped() -> None:
    for mode in ("raise", "slow"):
        async with served(Stamp("skip", mode)) as (http, cluster, runtime):
            response = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": USER})
            assert response.status_code == 200, response.text
            assert [m.role for m in cluster.params().messages] == ["user"]
            counters = runtime.stats()["loaded"][0]["counters"]["transform_chat_request"]
            assert counters["failures" if mode == "raise" else "timeouts"] == 1


@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": USER}, "openai"),
        ("/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": USER}, "anthropic"),
        ("/ollama/api/chat", {"model": MODEL, "messages": USER}, "ollama"),
    ],
)
@pytest.mark.parametrize("mode", ["raise", "slow"])
async def test_a_fail_policy_transform_refuses_in_the_callers_shape(
    path: str, body: dict, shape: str, mode: str
) -> None:
    async with served(Stamp("fail", mode)) as (http, cluster, _):
        response = await http.post(path, json=body)
    assert response.status_code == 502, response.text
    error = response.json()
    if shape == "openai":
        assert error["error"]["code"] == "extension_failed"
        message = error["error"]["message"]
    elif shape == "anthropic":
        assert error["type"] == "error"
        message = error["error"]["message"]
    else:
        message = error["error"]
    assert "Extension 'stamp' failed" in message
    assert ("policy backend down" if mode == "raise" else "did not return within") in message
    assert cluster.commands == []  # nothing was dispatched


async def test_a_client_that_leaves_mid_stream_is_observed_once() -> None:
    ext = Stamp()
    async with served(ext) as (http, _cluster, _):
        async with http.stream(
            "POST", "/v1/chat/completions", json={"model": MODEL, "messages": USER, "stream": True}
        ) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: ") and json.loads(line[6:]).get("choices"):
                    break
        await until(lambda: len(ext.summaries) == 1)
    assert len(ext.summaries) == 1


async def test_embeddings_for_extensions_answer_as_the_route_does() -> None:
    app, _cluster = scripted_app(vectors=lambda n: [[0.5, 0.5]] * n)
    vectors = await embed_in_process(app.state.skulk, MODEL, ["a", "b"])
    assert vectors == [[0.5, 0.5], [0.5, 0.5]]


async def _chunks(closed: list[bool]):
    try:
        for text in ("a", "b", "c"):
            yield TokenChunk(command_id=CommandId("c1"), text=text)
    finally:
        closed.append(True)


async def test_without_observers_the_output_is_not_wrapped() -> None:
    app, _cluster = scripted_app()
    output = _chunks([])
    assert observed(app.state.skulk, output, wire="openai.chat", request_id="r", model_id=MODEL) is output


async def test_closing_the_tap_closes_the_output_and_observes_it_once() -> None:
    ext = Stamp()
    async with served(ext) as (_http, _cluster, runtime):
        closed: list[bool] = []
        tap = observed(
            ApiContext(node_id="n1", node_name="one", get_state=State, extensions=runtime),
            _chunks(closed),
            wire="openai.chat",
            request_id="r",
            model_id=MODEL,
        )
        assert (await anext(tap)).text == "a"
        await tap.aclose()  # the client left
        assert closed == [True]  # the command's own stream is closed (and so cancelled) at once
        await until(lambda: len(ext.summaries) == 1)
    [summary] = ext.summaries
    assert (summary.text, summary.error) == ("a", "the response was closed before it ended")
