"""Attack: strings that are not valid Unicode and numbers JSON cannot carry, on every route.

Before (parent commit): a lone UTF-16 surrogate ("\\ud800" in JSON) in chat content or a
model id gave 503 ("could not reach the master": the command framing could not encode it),
in /v1/messages a 503 too, and in a `/models/add` path a 500 followed by a reset connection.

Now: any JSON body holding a lone surrogate (in a value or a key), NaN, Infinity or a number
past float range is a 400 in the caller's wire shape on every route that takes a body, before
the route parses it; and nothing reaches the cluster.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from skulk.api.errors import NATIVE_V1_PREFIXES
from skulk.shared.body_limits import AUDIO_UPLOAD_PATHS
from tests.api.scripted_cluster import asgi_http, scripted_app
from tests.api.test_openai_routes import INSTANCE, MODEL

pytestmark = pytest.mark.timeout(120)

APP, CLUSTER = scripted_app(["ok"], context_fields={"instance_lookup": lambda _m: INSTANCE})


def body_routes() -> list[tuple[str, str]]:
    """(method, path) of every route that may take a body, path parameters filled in."""
    routes = []
    for path, operations in APP.openapi()["paths"].items():
        for method in sorted(operations):
            if method.upper() in ("POST", "PUT", "PATCH", "DELETE"):
                routes.append((method.upper(), re.sub(r"\{[^}]+\}", "some-id", path)))
    return routes


ROUTES = body_routes()

BAD_BODIES = {
    "surrogate in a value": f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "a\\ud800b"}}]}}',
    "surrogate in a model id": '{"model": "m\\udfff", "modelId": "m\\udfff", "messages": [{"role": "user", "content": "a"}]}',
    "surrogate in a path": '{"path": "/tmp/\\ud800.gguf", "modelId": "x"}',
    "surrogate in a key": f'{{"model": "{MODEL}", "\\ud800": 1}}',
    "NaN": f'{{"model": "{MODEL}", "temperature": NaN, "messages": [{{"role": "user", "content": "a"}}]}}',
    "Infinity": f'{{"model": "{MODEL}", "top_p": -Infinity, "messages": [{{"role": "user", "content": "a"}}]}}',
    "past float range": f'{{"model": "{MODEL}", "temperature": 1e999, "messages": [{{"role": "user", "content": "a"}}]}}',
}


def shape_of(path: str, payload) -> str:
    if path.startswith("/v1/messages"):
        assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
        return payload["error"]["message"]
    if path.startswith("/ollama") or path.startswith("/api/"):
        return payload["error"]
    openai_shaped = path.startswith("/store/")  # /store answers in the OpenAI shape (issue 13)
    if openai_shaped or (path.startswith("/v1/") and not path.startswith(NATIVE_V1_PREFIXES)):
        assert payload["error"]["type"] == "invalid_request_error"
        return payload["error"]["message"]
    assert payload["errorKind"] == "invalid_request"
    return payload["detail"]


def test_every_body_route_is_covered():
    paths = {path for _, path in ROUTES}
    for expected in ("/v1/chat/completions", "/v1/messages", "/ollama/api/chat", "/models/add", "/place_instance",
                     "/v1/embeddings", "/v1/responses", "/v1/completions"):
        assert expected in paths


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_bad_json_values_are_400_on_every_route(case):
    async def go():
        async with asgi_http(APP) as client:
            answers = []
            for method, path in ROUTES:
                response = await client.request(method, path, content=BAD_BODIES[case],
                                                 headers={"content-type": "application/json"})
                answers.append((method, path, response))
            return answers

    before = len(CLUSTER.commands)
    for method, path, response in asyncio.run(go()):
        assert response.status_code == 400, (method, path, response.text)
        message = shape_of(path, response.json())
        if path in AUDIO_UPLOAD_PATHS:  # multipart only: a JSON body is refused before it is read as JSON
            assert "multipart/form-data" in message, (path, message)
            continue
        assert ("Unicode" in message) if "surrogate" in case else ("finite" in message), (path, message)
    assert len(CLUSTER.commands) == before  # nothing reached the cluster


@pytest.mark.parametrize("path", ["/v1/models/%ED%A0%80", "/ollama/api/show?name=%ED%A0%80", "/state?x=%ED%B0%80"])
def test_invalid_utf8_in_urls_is_never_a_5xx(path):
    async def go():
        async with asgi_http(APP) as client:
            return await client.get(path)

    assert asyncio.run(go()).status_code < 500


def test_valid_text_still_passes():
    async def go():
        async with asgi_http(APP) as client:
            return await client.post("/v1/chat/completions", json={
                "model": MODEL, "temperature": 0.5,
                "messages": [{"role": "user", "content": "caf\u00e9 \U0001F600 \\ud800 as text"}]})

    response = asyncio.run(go())
    assert response.status_code == 200, response.text
