"""Diagnostics routes: what this node's bounded queues, logs and leases are doing."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

router = APIRouter()


@router.get("/v1/diagnostics/node")
def node_diagnostics(request: Request) -> dict[str, Any]:
    context = request.app.state.skulk
    return {"nodeId": context.node_id, "nodeName": context.node_name, **context.get_diagnostics(),
            "eventStreams": context.state_feed.stats()}
