"""The OpenAI routes end to end inside one process: a hand-built ApiContext whose
`submit_command` plays the cluster, delivering a runner's frames into the API's streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest
from starlette.requests import ClientDisconnect

from skulk.api.app import ApiContext, create_app
from skulk.api.streams import CommandStreams
from skulk.shared.types.chunks import StreamPayload, StreamStarted, StreamTerminal, TokenChunk
from skulk.shared.types.commands import CancelCommand, GenerateText, TaskFinished
from skulk.shared.types.common import Usage
from skulk.shared.types.instances import Instance, RunnerStatus, ShardAssignment
from skulk.shared.types.state import State

MODEL = "local/tiny-llama"
INSTANCE = Instance(
    instance_id="i1", model_id=MODEL, sharding="Pipeline",
    shards=[ShardAssignment(node_id="n1", runner_id="r1", rank=0, world_size=1, start_layer=0, end_layer=6,
                            backend="llama_cpp-cpu")],
    context_token_limit=2048,
)
STATE = State(instances={"i1": INSTANCE}, runners={"r1": RunnerStatus(state="Ready")})
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
USAGE = Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)


HANG_GUARD_S = 30.0
"""How long an in-process wait may take before a test calls it a hang. A hang guard, not a
performance bound: the happy path never waits it out, and on a loaded 2-core box a request's
first pass through the app once took longer than the 3 s this used to be."""


async def until(condition: Callable[[], bool], timeout_s: float = HANG_GUARD_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


class FakeCluster:
    """Records commands; on GenerateText, a simulated rank-0 runner sends frames back."""

    def __init__(self, streams: CommandStreams, runner: str = "complete", tokens=("Hel", "lo"),
                 finish: str = "stop") -> None:
        self.streams = streams
        self.runner = runner
        self.tokens = tokens
        self.finish = finish
        self.commands: list = []
        self.inputs: dict = {}
        """Each request's full params, as the serving node receives them (the commands the
        master sees carry redacted params)."""
        self.tasks: list[asyncio.Task] = []

    def hold_input(self, item) -> None:
        self.inputs[item.command_id] = item

    def params_of(self, kind: type) -> list:
        """The full params of every command of `kind`, in order."""
        return [self.inputs[c.command_id].params for c in self.of(kind)]

    async def submit(self, command) -> None:
        self.commands.append(command)
        if isinstance(command, GenerateText):
            self.tasks.append(asyncio.create_task(self._run(command.command_id)))

    def of(self, kind: type) -> list:
        return [c for c in self.commands if isinstance(c, kind)]

    @property
    def command_id(self) -> str:
        return self.of(GenerateText)[0].command_id

    async def _run(self, cid: str) -> None:
        if self.runner == "silent":
            return
        self.streams.deliver(StreamStarted(command_id=cid, runner_id="r1"))
        for seq, text in enumerate(self.tokens, start=1):
            await asyncio.sleep(0)
            last = seq == len(self.tokens)
            chunk = TokenChunk(command_id=cid, text=text, finish_reason=self.finish if last else None,
                               usage=USAGE if last else None)
            self.streams.deliver(StreamPayload(command_id=cid, seq=seq, chunk=chunk))
        end = len(self.tokens) + 1
        if self.runner == "complete":
            self.streams.deliver(StreamTerminal(command_id=cid, seq=end, outcome="completed"))
        elif self.runner == "fail":
            self.streams.deliver(StreamTerminal(command_id=cid, seq=end, outcome="failed",
                                                error_type="RunnerCrashed", error_message="the runner died"))
        # "hang": started, some tokens, then nothing


def make(runner: str = "complete", *, streams: CommandStreams | None = None, master: str | None = "n1",
         tokens=("Hel", "lo"), finish: str = "stop", state: State = STATE, **context_fields):
    streams = streams or CommandStreams()
    cluster = FakeCluster(streams, runner, tokens, finish)
    context = ApiContext(
        node_id="n1", node_name="one", get_state=lambda: state, get_master=lambda: (master, "s1" if master else None),
        submit_command=cluster.submit, hold_input=cluster.hold_input, streams=streams, **context_fields,
    )
    return create_app(context), cluster


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://skulk")


def sse(text: str) -> list:
    events = [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def assert_openai_error(response: httpx.Response, status: int, **fields) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for name, value in fields.items():
        assert error[name] == value, error
    return error


# ---------------------------------------------------------------------------------------


async def test_non_streaming_completion():
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5, "temperature": 0})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["id"] == f"chatcmpl-{cluster.command_id}"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0}}
    generate = cluster.of(GenerateText)[0]
    generate_params = cluster.inputs[generate.command_id].params
    assert generate.params.messages[0].content == ""  # the master sees no text
    assert (generate_params.model_id, generate_params.max_tokens, generate_params.temperature) == (MODEL, 5, 0.0)
    await until(lambda: len(cluster.of(TaskFinished)) == 1)
    assert cluster.of(TaskFinished)[0].finished_command_id == generate.command_id
    assert cluster.of(CancelCommand) == []
    assert cluster.streams.stats()["openStreams"] == 0


async def test_streaming_completion_with_usage():
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/chat/completions",
                                   json={**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse(response.text)
    assert events[-1] == "[DONE]"
    *chunks, usage_chunk, _ = events
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hello"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["total_tokens"] == 5
    assert {c["id"] for c in events[:-1]} == {f"chatcmpl-{cluster.command_id}"}
    await until(lambda: len(cluster.of(TaskFinished)) == 1)
    assert cluster.of(CancelCommand) == []


async def test_unplaced_model_is_a_404_naming_the_fix():
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/chat/completions", json={**CHAT, "model": "acme/unplaced"})
    error = assert_openai_error(response, 404, code="model_not_found", param="model")
    assert 'POST /place_instance {"modelId": "acme/unplaced"}' in error["message"]
    assert cluster.commands == [] and cluster.streams.stats()["openStreams"] == 0


@pytest.mark.parametrize(
    ("content", "headers"),
    [(b'{"model": ', {"content-type": "application/json"}), (b"", {"content-type": "application/json"}),
     (b"[1, 2]", {"content-type": "application/json"}), (b"model=x", {"content-type": "text/plain"})],
    ids=["truncated", "empty", "array", "not-json"],
)
async def test_malformed_bodies_are_openai_400s(content, headers):
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/chat/completions", content=content, headers=headers)
    assert_openai_error(response, 400, type="invalid_request_error", code="invalid_json")
    assert cluster.commands == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"temperature": 3}, "temperature"), ({"n": 9}, "n"), ({"messages": []}, "messages"),
     ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"), ({"model": None}, "model"),
     ({"max_tokens": 4096}, "max_tokens"), ({"max_completion_tokens": 4096}, "max_completion_tokens")],
)
async def test_bad_parameters_are_openai_400s_naming_the_parameter(fields, param):
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/chat/completions", json={**CHAT, **fields})
    assert_openai_error(response, 400, type="invalid_request_error", param=param)
    assert cluster.commands == []


async def test_unknown_routes_and_methods_under_v1_speak_openai():
    app, _ = make()
    async with client(app) as http:
        unknown = await http.post("/v1/does-not-exist", json={})
        wrong_method = await http.get("/v1/chat/completions")
        native = await http.get("/not-a-route")
    assert_openai_error(unknown, 404, code="unknown_url")
    assert_openai_error(wrong_method, 405, code="method_not_allowed")
    assert native.status_code == 404 and native.json() == {"detail": "Not Found"}


async def test_native_routes_keep_fastapi_validation_errors():
    app, _ = make()
    async with client(app) as http:
        response = await http.put("/v1/tracing", json={"enabled": "maybe"})
    assert response.status_code == 422 and "detail" in response.json()


async def test_no_master_is_a_503():
    app, cluster = make(master=None)
    async with client(app) as http:
        response = await http.post("/v1/chat/completions", json=CHAT)
    assert_openai_error(response, 503, code="cluster_not_ready")
    assert cluster.commands == []


async def test_submit_failure_is_a_503_and_frees_the_stream():
    streams = CommandStreams()

    async def unreachable(_command):
        raise ConnectionError("no route to the master")

    context = ApiContext(node_id="n1", node_name="one", get_state=lambda: STATE, get_master=lambda: ("n1", "s1"),
                         submit_command=unreachable, streams=streams)
    async with client(create_app(context)) as http:
        response = await http.post("/v1/chat/completions", json=CHAT)
    assert_openai_error(response, 503, code="cluster_not_ready")
    assert streams.stats()["openStreams"] == 0


async def test_overloaded_is_a_503_with_retry_after():
    app, cluster = make("silent", streams=CommandStreams(max_open_streams=1))
    async with client(app) as http:
        first = asyncio.create_task(http.post("/v1/chat/completions", json=CHAT))
        await until(lambda: cluster.streams.stats()["openStreams"] == 1)
        second = await http.post("/v1/chat/completions", json=CHAT)
        cluster.streams.fail_all("MasterFailover", "test over")
        await first
    assert_openai_error(second, 503, code="overloaded")
    assert second.headers["retry-after"] == "1"


async def test_runner_failure_non_streaming_is_an_openai_error():
    app, cluster = make("fail")
    async with client(app) as http:
        response = await http.post("/v1/chat/completions", json=CHAT)
    assert_openai_error(response, 500, type="server_error", code="RunnerCrashed", message="the runner died")
    await until(lambda: len(cluster.of(TaskFinished)) == 1)  # the runner ended it: the task may go
    assert cluster.of(CancelCommand) == []


async def test_runner_failure_streaming_is_an_error_event():
    app, _ = make("fail")
    async with client(app) as http:
        response = await http.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    events = sse(response.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "RunnerCrashed"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2]) == "Hello"


async def test_failover_ends_streaming_requests_with_an_error_event():
    app, cluster = make("hang")
    async with client(app) as http:
        pending = asyncio.create_task(http.post("/v1/chat/completions", json={**CHAT, "stream": True}))
        await until(lambda: cluster.commands and cluster.streams.stats()["deliveredFrames"] == 3)
        assert cluster.streams.fail_all("MasterFailover", "the master changed; resend the request") == 1
        response = await asyncio.wait_for(pending, timeout=HANG_GUARD_S)
    events = sse(response.text)
    assert events[-1] == "[DONE]"
    assert events[-2]["error"] == {"message": "the master changed; resend the request", "type": "server_error",
                                   "param": None, "code": "MasterFailover"}
    await until(lambda: len(cluster.of(CancelCommand)) == 1)  # this side ended it: tell the cluster
    assert cluster.of(TaskFinished) == []


async def test_first_frame_deadline_fails_the_request():
    app, cluster = make("silent", streams=CommandStreams(first_frame_deadline_s=0.05))
    async with client(app) as http:
        response = await http.post("/v1/chat/completions", json=CHAT)
    assert_openai_error(response, 504, code="first_frame_timeout")
    await until(lambda: len(cluster.of(CancelCommand)) == 1)


async def test_cancel_route_ends_the_request_and_tells_the_cluster():
    app, cluster = make("hang")
    async with client(app) as http:
        pending = asyncio.create_task(http.post("/v1/chat/completions", json=CHAT))
        await until(lambda: bool(cluster.commands) and cluster.streams.stats()["deliveredFrames"] == 3)
        cancel = await http.post(f"/v1/cancel/chatcmpl-{cluster.command_id}")
        response = await asyncio.wait_for(pending, timeout=HANG_GUARD_S)
    assert cancel.status_code == 200
    assert cancel.json() == {"commandId": cluster.command_id, "cancelled": True, "ownedHere": True}
    assert_openai_error(response, 499, code="cancelled")
    await asyncio.sleep(0.01)
    cancels = cluster.of(CancelCommand)
    assert [c.cancelled_command_id for c in cancels] == [cluster.command_id]  # exactly once


async def test_cancel_of_an_unknown_request_is_a_404():
    app, cluster = make()
    async with client(app) as http:
        response = await http.post("/v1/cancel/nope")
    assert_openai_error(response, 404, code="unknown_command")
    assert cluster.commands == []


async def test_models_lists_placed_models_with_their_context():
    app, _ = make()
    async with client(app) as http:
        listing = (await http.get("/v1/models")).json()
        one = await http.get(f"/v1/models/{MODEL}")
        missing = await http.get("/v1/models/acme/none")
    assert listing["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"], m["context_length"]) for m in listing["data"]] == [
        (MODEL, "model", "skulk", 2048)]
    assert one.json()["id"] == MODEL
    assert_openai_error(missing, 404, code="model_not_found")


# ---------------------------------------------------------------------------------------
# Client disconnects, driven at the ASGI level (httpx's transport buffers whole responses)
# ---------------------------------------------------------------------------------------


class AsgiCall:
    """One POST driven by hand, so the test decides when the client goes away."""

    def __init__(self, app, body: dict, spec_version: str, path: str = "/v1/chat/completions") -> None:
        self.app = app
        self.path = path
        self.body = json.dumps(body).encode()
        self.spec_version = spec_version
        self.gone = asyncio.Event()
        self.sent: list[dict] = []
        self._body_sent = False

    async def receive(self) -> dict:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if self.gone.is_set() and self.spec_version == "2.4":
            raise OSError("client gone")
        self.sent.append(message)

    @property
    def body_text(self) -> str:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body").decode()

    async def __call__(self) -> None:
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": self.spec_version}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": self.path, "raw_path": self.path.encode(),
            "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000), "server": ("skulk", 80),
            "headers": [(b"host", b"skulk"), (b"content-type", b"application/json")],
        }
        try:
            await self.app(scope, self.receive, self.send)
        except (OSError, ClientDisconnect):  # sending to a departed client may fail; cleanup must not
            pass


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
async def test_client_disconnect_cancels_the_command(stream, spec_version):
    app, cluster = make("hang")
    call = AsgiCall(app, {**CHAT, "stream": stream}, spec_version)
    running = asyncio.create_task(call())
    if stream:
        await until(lambda: "Hel" in call.body_text)  # the client has seen output
    else:
        await until(lambda: cluster.streams.stats()["deliveredFrames"] == 3)
    call.gone.set()
    await asyncio.wait_for(running, timeout=HANG_GUARD_S)
    await until(lambda: len(cluster.of(CancelCommand)) == 1)
    assert cluster.of(CancelCommand)[0].cancelled_command_id == cluster.command_id
    assert cluster.of(TaskFinished) == []
    stats = cluster.streams.stats()
    assert stats["openStreams"] == 0 and stats["closedByClient"] == 1
    await asyncio.sleep(0.01)
    assert len(cluster.of(CancelCommand)) == 1  # exactly once


# ---------------------------------------------------------------------------------------
# The official SDK, unchanged
# ---------------------------------------------------------------------------------------


async def test_official_openai_sdk():
    openai = pytest.importorskip("openai")
    app, _ = make()
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://skulk")
    sdk = openai.AsyncOpenAI(base_url="http://skulk/v1", api_key="unused", http_client=http, max_retries=0)
    try:
        models = await sdk.models.list()
        assert [m.id for m in models.data] == [MODEL]

        completion = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                       max_tokens=8)
        assert completion.choices[0].message.content == "Hello"
        assert completion.choices[0].finish_reason == "stop"
        assert completion.usage.total_tokens == 5

        stream = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                   stream=True, stream_options={"include_usage": True})
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage:
                usage = chunk.usage
        assert text == "Hello" and usage.completion_tokens == 2

        with pytest.raises(openai.NotFoundError) as not_found:
            await sdk.chat.completions.create(model="acme/unplaced", messages=[{"role": "user", "content": "hi"}])
        assert "POST /place_instance" in not_found.value.message
        with pytest.raises(openai.BadRequestError) as bad:
            await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], n=9)
        assert bad.value.body["param"] == "n"
    finally:
        await sdk.close()


async def test_official_openai_sdk_sees_a_stream_error():
    openai = pytest.importorskip("openai")
    app, _ = make("fail")
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://skulk")
    sdk = openai.AsyncOpenAI(base_url="http://skulk/v1", api_key="unused", http_client=http, max_retries=0)
    try:
        stream = await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                   stream=True)
        with pytest.raises(openai.APIError, match="the runner died"):
            async for _ in stream:
                pass
    finally:
        await sdk.close()


FAILED_STATE = STATE.model_copy(update={"runners": {"r1": RunnerStatus(state="Failed", error_message="engine crashed")}})


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/completions", {"model": MODEL, "prompt": "hi"}),
        ("/v1/embeddings", {"model": MODEL, "input": "hi"}),
    ],
)
async def test_a_model_whose_only_runner_failed_is_a_503_at_once_naming_the_runner(path, body):
    app, cluster = make(state=FAILED_STATE)
    async with client(app) as http:
        response = await http.post(path, json=body)
    error = assert_openai_error(response, 503, code="model_not_serving", param="model")
    assert "runner r1 on node n1 is Failed (engine crashed)" in error["message"]
    assert cluster.commands == [] and cluster.streams.stats()["openStreams"] == 0
