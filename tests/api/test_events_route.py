"""`GET /v1/events` and the dashboard's static files, through the FastAPI app."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

from fastapi.testclient import TestClient

from skulk.api.app import ApiContext, create_app
from skulk.api.routes import events
from skulk.api.state_feed import StateFeed
from skulk.shared.types.events import IndexedEvent, InstanceDeleted
from skulk.shared.types.state import NodeInfo, State

STATE = State(nodes={"a": NodeInfo(node_id="a", node_name="alpha", version="0")})


def context(**fields) -> ApiContext:
    return ApiContext(node_id="a", node_name="alpha", get_state=lambda: STATE, **fields)


def parse(frame: bytes) -> tuple[str, dict]:
    lines = dict(line.split(": ", 1) for line in frame.decode().strip().split("\n") if not line.startswith(":"))
    return lines["event"], json.loads(lines["data"])


async def test_a_snapshot_comes_first_and_another_after_each_change(monkeypatch):
    monkeypatch.setattr(events, "COALESCE_S", 0.0)
    feed = StateFeed()
    ctx = context(state_feed=feed)
    feed.subscribe()
    frames = events._frames(ctx)
    assert await anext(frames) == b"retry: 2000\n\n"
    kind, first = parse(await anext(frames))
    assert kind == "snapshot"
    assert first["cluster"]["nodes"][0]["name"] == "alpha" and "nodeHealth" in first["state"]
    assert first["events"] == []
    next_frame = asyncio.ensure_future(anext(frames))
    await asyncio.sleep(0)
    feed.record(IndexedEvent(idx=0, origin="a", indexed_at=datetime.now(UTC),
                             event=InstanceDeleted(event_id="e", instance_id="gone", reason="operator")))
    kind, second = parse(await asyncio.wait_for(next_frame, timeout=10))
    assert [e["type"] for e in second["events"]] == ["InstanceDeleted"]
    await frames.aclose()
    assert feed.subscribers == 0  # a closed stream gives its place back


def test_more_streams_than_the_bound_is_a_503():
    feed = StateFeed(max_subscribers=0)
    response = TestClient(create_app(context(state_feed=feed))).get("/v1/events")
    assert response.status_code == 503 and response.json()["code"] == "overloaded"


def test_the_dashboard_is_served_without_a_key_and_the_api_is_not():
    client = TestClient(create_app(context(api_key="k")))
    page = client.get("/")
    assert page.status_code == 200 and "<skulk-topology" in page.text
    assert client.get("/static/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/static/styles.css").status_code == 200
    assert client.get("/v1/events").status_code == 401
    assert client.get("/state").status_code == 401


def test_member_diagnostics_name_an_unknown_node_and_answer_for_this_one():
    client = TestClient(create_app(context()))
    unknown = client.get("/v1/diagnostics/cluster/nope")
    assert unknown.status_code == 404 and unknown.json()["code"] == "unknown_node"
    mine = client.get("/v1/diagnostics/cluster/a").json()
    assert mine["nodeId"] == "a" and mine["eventStreams"]["capacity"] > 0


def test_the_dashboard_directory_override_is_served_and_a_missing_page_is_a_404(tmp_path, monkeypatch):
    (tmp_path / "index.html").write_text("<p>custom dashboard</p>")
    monkeypatch.setenv("SKULK_DASHBOARD_DIR", str(tmp_path))
    assert "custom dashboard" in TestClient(create_app(context())).get("/").text
    monkeypatch.setenv("SKULK_DASHBOARD_DIR", str(tmp_path / "absent"))
    missing = TestClient(create_app(context())).get("/")
    assert missing.status_code == 404 and "skulk doctor" in missing.text


async def test_a_stopping_node_ends_open_streams_and_refuses_new_ones():
    feed = StateFeed()
    ctx = context(state_feed=feed)
    feed.subscribe()
    frames = events._frames(ctx)
    await anext(frames)
    await anext(frames)  # the first snapshot
    pending = asyncio.ensure_future(anext(frames))
    await asyncio.sleep(0)
    feed.close()
    try:
        await asyncio.wait_for(pending, timeout=10)
        raise AssertionError("the stream went on after close")
    except StopAsyncIteration:
        pass
    assert feed.subscribers == 0
    refused = TestClient(create_app(ctx)).get("/v1/events")
    assert refused.status_code == 503 and refused.json()["code"] == "node_stopping"
