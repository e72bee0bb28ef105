"""The capability routes on one node's app, with the fabric over an in-memory wire to a
provider node `b` and a member `c` that never answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from skulk.api.app import create_app
from skulk.api.context import ApiContext
from skulk.api.routes import capabilities as routes
from skulk.extensions.providers.fabric import ProviderFabric
from skulk.extensions.providers.registry import ProviderRegistry
from skulk.shared.types.state import NodeInfo, State
from tests.api.scripted_cluster import asgi_http
from tests.extensions.provider_kit import KitProvider
from tests.extensions.providers.wire_kit import Wire

STATE = State(nodes={n: NodeInfo(node_id=n, node_name=n, version="0.1.0") for n in ("a", "b", "c")})


@pytest.fixture
async def fabrics(monkeypatch) -> AsyncIterator[tuple[ProviderFabric, ProviderFabric]]:
    monkeypatch.setattr(routes, "DESCRIBE_TIMEOUT_S", 0.2)
    wire = Wire()
    registry = ProviderRegistry()
    registry.add(KitProvider(), "kit")
    a, b = wire.add("a", ProviderRegistry()), wire.add("b", registry)
    yield a, b
    await a.close()
    await b.close()


def app_of(fabric: ProviderFabric | None) -> Any:
    return create_app(ApiContext(node_id="a", node_name="a", get_state=lambda: STATE, capabilities=fabric))


async def test_the_listing_reports_a_silent_node_instead_of_failing(fabrics):
    a, b = fabrics
    async with asgi_http(app_of(a)) as client:
        body = (await client.get("/v1/capabilities")).json()
    assert {row["id"] for row in body["data"]} == {d.id for d in b.registry.descriptors()}
    assert {row["node"] for row in body["data"]} == {"b"}
    echo = next(row for row in body["data"] if row["id"] == "echo")
    assert echo["revision"] == b.registry.get("echo", "1.0.0").descriptor.revision  # type: ignore[union-attr]
    assert set(echo) >= {"node", "id", "version", "revision", "description", "ioMode", "inputSchema", "outputSchema"}
    assert body["unreachable"] == [
        {"node": "c", "code": "node_unreachable", "detail": body["unreachable"][0]["detail"]}
    ]


async def test_calls_answer_json_sse_and_typed_errors(fabrics):
    a, b = fabrics

    def body(cid: str, payload: Any, **over: Any) -> dict[str, Any]:
        revision = b.registry.get(cid, "1.0.0").descriptor.revision  # type: ignore[union-attr]
        return {"node": "b", "version": "1.0.0", "revision": revision, "input": payload, **over}

    async with asgi_http(app_of(a)) as client:
        unary = await client.post("/v1/capabilities/echo/call", json=body("echo", {"text": "hi"}))
        assert unary.status_code == 200 and unary.json()["output"] == {"text": "hi"}

        stream = await client.post("/v1/capabilities/count/call", json=body("count", {"n": 2}))
        assert stream.headers["content-type"].startswith("text/event-stream")
        assert stream.text == (
            'event: chunk\ndata: {"seq":0,"output":{"i":0}}\n\n'
            'event: chunk\ndata: {"seq":1,"output":{"i":1}}\n\n'
            'event: completed\ndata: {"chunks":2}\n\n'
        )

        stranger = await client.post("/v1/capabilities/echo/call", json=body("echo", {"text": "x"}, node="zzz"))
        assert stranger.status_code == 502 and stranger.json()["code"] == "node_unreachable"

        missing = await client.post("/v1/capabilities/echo/call", json={"node": "b", "input": {}})
        assert missing.status_code == 400 and missing.json()["errorKind"] == "invalid_request"

        too_long = await client.post("/v1/capabilities/echo/call", json=body("echo", {"text": "x"}, timeoutS=601))
        assert too_long.status_code == 400

        bad = await client.post("/v1/capabilities/echo/call", json=body("echo", {"text": 1}))
        assert bad.status_code == 400 and bad.json() == {
            "detail": bad.json()["detail"],
            "errorKind": "invalid_request",
            "param": "input",
            "code": "input_invalid",
        }


async def test_a_node_without_a_fabric_lists_nothing_and_refuses_calls():
    async with asgi_http(app_of(None)) as client:
        assert (await client.get("/v1/capabilities")).json() == {"object": "list", "data": [], "unreachable": []}
        refused = await client.post(
            "/v1/capabilities/echo/call", json={"node": "b", "version": "1.0.0", "revision": "r", "input": {}}
        )
    assert refused.status_code == 503 and refused.json()["code"] == "capabilities_unavailable"
