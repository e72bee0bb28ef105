"""Optional API keys (`ApiContext.api_key`, from `SKULK_API_KEY`): every registered route
refuses a missing or wrong key with a 401 in its caller's wire shape and accepts the right
one; without a key everything stays open."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.routing import Route

from skulk.api.access import Role, route_role
from skulk.api.auth import check_api_key, is_open_path
from skulk.api.errors import wire_shape_for
from skulk.shared.types.commands import CancelCommand, TaskFinished
from tests.api.test_openai_routes import CHAT, HANG_GUARD_S, MODEL, AsgiCall, make, until

KEY = "sk-skulk-test-key"


def _flatten(routes) -> list:
    """Routes with a path and methods; FastAPI >= 0.16x keeps included routers as one entry
    (`effective_route_contexts`), older versions list `APIRoute`s directly."""
    flat = []
    for route in routes:
        if hasattr(route, "effective_route_contexts"):
            flat.extend(route.effective_route_contexts())
        elif isinstance(route, (APIRoute, Route)) or (hasattr(route, "path") and hasattr(route, "methods")):
            flat.append(route)
    return flat


ENDLESS = frozenset({("GET", "/v1/events")})
"""Routes whose accepted answer is a stream that never ends (the in-process transport would
wait for its end): only their refusals are checked here; test_events_route reads them."""


def route_calls(app) -> list[tuple[str, str]]:
    """(method, concrete path) for every registered route and method but the open ones: the
    dashboard's assets (`test_static_assets_stay_open`) and redeeming a join invite
    (`test_redeeming_an_invite_needs_no_key`)."""
    calls = []
    for route in _flatten(app.routes):
        if is_open_path(route.path):
            continue
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        for method in sorted(route.methods or ()):
            if route_role(method, path) is not Role.OPEN:
                calls.append((method, path))
    return calls


def raw_client(app) -> httpx.AsyncClient:
    # A route that fails on the hand-built context (a 500) still counts as "not refused".
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://skulk")


def assert_refusal(response: httpx.Response, method: str, path: str) -> None:
    assert response.status_code == 401, (method, path, response.status_code, response.text)
    assert response.headers["www-authenticate"] == "Bearer"
    if method == "HEAD":
        return
    body = response.json()
    shape = wire_shape_for(path)
    if shape == "openai":
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "invalid_api_key"
        assert set(body["error"]) == {"message", "type", "param", "code"}
    elif shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
        assert body["error"]["message"]
    elif shape == "ollama":
        assert set(body) == {"error"} and isinstance(body["error"], str)
    else:
        assert body["error"]["code"] == "invalid_api_key" and body["error"]["message"]


def test_check_api_key_is_pure():
    assert check_api_key({}, None) and check_api_key({}, "")
    assert not check_api_key({}, KEY)
    assert check_api_key({"Authorization": f"Bearer {KEY}"}, KEY)
    assert check_api_key({"authorization": f"bearer {KEY}"}, KEY)
    assert not check_api_key({"authorization": f"Basic {KEY}"}, KEY)
    assert not check_api_key({"authorization": "Bearer nope"}, KEY)
    assert not check_api_key({"authorization": f"Bearer {KEY}x"}, KEY)
    assert check_api_key({"x-api-key": KEY}, KEY)
    assert not check_api_key({"x-api-key": KEY}, KEY, accept_x_api_key=False)
    assert check_api_key({"x-api-key": "nope", "authorization": f"Bearer {KEY}"}, KEY)
    assert not check_api_key({"authorization": "Bearer ünïcode"}, KEY)  # non-ASCII never crashes
    assert is_open_path("/") and is_open_path("/static/app.js") and not is_open_path("/state")


async def test_every_route_requires_the_key_in_its_wire_shape():
    app, cluster = make(api_key=KEY)
    calls = route_calls(app)
    assert ("POST", "/v1/completions") in calls and ("POST", "/v1/responses") in calls
    assert ("POST", "/v1/messages") in calls and ("POST", "/ollama/api/chat") in calls
    async with raw_client(app) as http:
        for method, path in calls:
            missing = await http.request(method, path)
            assert_refusal(missing, method, path)
            wrong = await http.request(method, path, headers={"Authorization": "Bearer wrong"})
            assert_refusal(wrong, method, path)
            wrong_x = await http.request(method, path, headers={"x-api-key": "wrong"})
            assert_refusal(wrong_x, method, path)
            if (method, path) in ENDLESS:
                continue
            right = await http.request(method, path, headers={"Authorization": f"Bearer {KEY}"})
            assert right.status_code != 401, (method, path, right.text)
            x_key = await http.request(method, path, headers={"x-api-key": KEY})
            if wire_shape_for(path) == "anthropic":
                assert x_key.status_code != 401, (method, path)
            else:
                assert_refusal(x_key, method, path)  # x-api-key is Anthropic's header only
        unknown = await http.get("/v1/nope")
        assert_refusal(unknown, "GET", "/v1/nope")  # unknown paths do not reveal what exists
    assert cluster.commands == []


async def test_without_a_key_everything_is_open():
    app, _ = make()
    async with raw_client(app) as http:
        for method, path in route_calls(app):
            if (method, path) in ENDLESS:
                continue
            response = await http.request(method, path)
            assert response.status_code != 401, (method, path)


async def test_static_assets_stay_open():
    app, _ = make(api_key=KEY)
    async with raw_client(app) as http:
        assert (await http.get("/")).status_code == 200
        assert (await http.get("/static/app.js")).status_code == 200
        assert (await http.get("/static/no-such-file.js")).status_code == 404


async def test_sdks_with_the_key():
    openai = pytest.importorskip("openai")
    app, _ = make(api_key=KEY)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://skulk")
    good = openai.AsyncOpenAI(base_url="http://skulk/v1", api_key=KEY, http_client=http, max_retries=0)
    bad = openai.AsyncOpenAI(base_url="http://skulk/v1", api_key="wrong", http_client=http, max_retries=0)
    try:
        completion = await good.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert completion.choices[0].message.content == "Hello"
        stream = await good.responses.create(model=MODEL, input="hi", stream=True)
        assert [e.type async for e in stream][-1] == "response.completed"
        with pytest.raises(openai.AuthenticationError) as refused:
            await bad.completions.create(model=MODEL, prompt="x")
        assert refused.value.code == "invalid_api_key"
    finally:
        await good.close()
        await bad.close()



def test_anthropic_sdk_sends_x_api_key():
    anthropic = pytest.importorskip("anthropic")
    from tests.api.live_server import live_server

    app, _ = make(api_key=KEY)
    with live_server(app) as base_url:
        claude = anthropic.Anthropic(base_url=base_url, api_key=KEY, max_retries=0)
        wrong = anthropic.Anthropic(base_url=base_url, api_key="wrong", max_retries=0)
        message = claude.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert message.content[0].text == "Hello"
        with pytest.raises(anthropic.AuthenticationError) as refused:
            wrong.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert refused.value.body["error"]["type"] == "authentication_error"


async def test_disconnect_still_cancels_behind_the_key_middleware():
    app, cluster = make("hang", api_key=KEY)

    async def with_key(scope, receive, send):
        scope = {**scope, "headers": [*scope["headers"], (b"authorization", f"Bearer {KEY}".encode())]}
        await app(scope, receive, send)

    call = AsgiCall(with_key, {**CHAT, "stream": True}, "2.4")
    running = asyncio.create_task(call())
    await until(lambda: "Hel" in call.body_text)
    call.gone.set()
    await asyncio.wait_for(running, timeout=HANG_GUARD_S)
    await until(lambda: len(cluster.of(CancelCommand)) == 1)
    assert cluster.of(TaskFinished) == []


async def test_redeeming_an_invite_needs_no_key():
    """A joining node has no key yet: the invite's proof is its credential, so the route
    answers (here: the body is missing) instead of refusing for want of a key."""
    app, _cluster = make(api_key=KEY)
    async with raw_client(app) as http:
        response = await http.post("/v1/cluster/join")
    assert response.status_code not in (401, 403), response.text

