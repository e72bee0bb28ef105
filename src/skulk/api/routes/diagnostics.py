"""Diagnostics routes: what this node's bounded queues, logs and leases are doing."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from skulk.observe.metrics import CONTENT_TYPE, exposition

router = APIRouter()


@router.get("/v1/diagnostics/node")
def node_diagnostics(request: Request) -> dict[str, Any]:
    context = request.app.state.skulk
    return {"nodeId": context.node_id, "nodeName": context.node_name, **context.get_diagnostics()}


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """Prometheus text exposition of this node's metrics (see `skulk.observe.metrics`)."""
    return Response(exposition(request.app.state.metrics.registry), media_type=CONTENT_TYPE)
