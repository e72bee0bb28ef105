"""`GET /v1/events`: one server-sent event stream of State changes (what the dashboard follows).

Each `snapshot` event carries everything the dashboard draws, in the shapes of the routes
operators already know: `cluster` (`GET /v1/cluster`), `state` (`GET /state`, with the
telemetry overlay and derived node health) and `events` (the recent event log). A frame is
sent when an indexed event is applied (bursts coalesce into one frame) and, because memory,
download progress and liveness ride the telemetry plane rather than the event log, when the
snapshot differs after `REFRESH_S`; otherwise a comment line keeps the connection alive. The
stream never queues: a slow client just sees fewer, fresher snapshots; it ends as soon as the
node starts to stop (`StateFeed.close`), so shutdown never waits on a dashboard.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from skulk.api.context import ApiContext, api_context
from skulk.api.errors import ApiError, Overloaded
from skulk.api.routes.control import cluster_body, state_body
from skulk.api.state_feed import StateFeed, TooManySubscribers

router = APIRouter()

REFRESH_S = 2.0
"""Longest gap between two looks at the snapshot: telemetry (memory, heartbeats, download
progress) changes without an event, and the telemetry heartbeat is every 2 s."""

COALESCE_S = 0.2
"""After a change, wait this long before rendering, so a burst of events (a placement
writes several) becomes one frame rather than one per event."""


class NodeStopping(ApiError):
    """The node is shutting down: no new event streams."""

    kind = "unavailable"
    default_code = "node_stopping"


def snapshot(context: ApiContext) -> dict[str, Any]:
    """What one `snapshot` frame carries."""
    feed: StateFeed = context.state_feed
    return {"cluster": cluster_body(context), "state": state_body(context), "events": feed.recent_wire()}


def sse_frame(event: str, data: str, event_id: int | None = None) -> bytes:
    """One server-sent event. `data` must be one line (JSON is)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {data}\n\n".encode()


async def _frames(context: ApiContext) -> AsyncIterator[bytes]:
    feed: StateFeed = context.state_feed
    try:
        yield b"retry: 2000\n\n"
        last_sent: str | None = None
        version = feed.version
        while True:
            body = json.dumps(snapshot(context), separators=(",", ":"))
            if body != last_sent:
                last_sent = body
                yield sse_frame("snapshot", body, version)
            else:
                yield b": keepalive\n\n"
            changed = await feed.wait_for_change(version, REFRESH_S)
            if feed.closed:  # the node is stopping: end the stream rather than be cut off
                return
            if changed != version:
                await asyncio.sleep(COALESCE_S)
            version = feed.version
    finally:
        feed.unsubscribe()


@router.get("/v1/events")
async def events(request: Request) -> StreamingResponse:
    context = api_context(request)
    if context.state_feed.closed:
        raise NodeStopping("this node is stopping; reconnect to another node or after it restarts")
    try:
        context.state_feed.subscribe()
    except TooManySubscribers as exc:
        raise Overloaded(f"{exc}; close a dashboard tab and retry") from None
    return StreamingResponse(
        _frames(context), media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
