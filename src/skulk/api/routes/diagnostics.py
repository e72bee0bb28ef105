"""Diagnostics routes: what this node's bounded queues, logs and leases are doing, and the
same for any member (`/v1/diagnostics/cluster/{nodeId}` asks that member's API, with this
node's API key, under `PEER_DIAGNOSTICS_TIMEOUT_S`)."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import APIRouter, Request

from skulk.api.errors import ApiError, NotFound

router = APIRouter()

PEER_DIAGNOSTICS_TIMEOUT_S = 5.0
"""How long a member's own diagnostics may take before the answer is a 504."""


class PeerUnreachable(ApiError):
    """A member's API did not answer (or answered an error) for its diagnostics."""

    kind = "upstream"
    default_code = "peer_unreachable"


def _local(request: Request) -> dict[str, Any]:
    context = request.app.state.skulk
    return {"nodeId": context.node_id, "nodeName": context.node_name, **context.get_diagnostics(),
            "eventStreams": context.state_feed.stats()}


@router.get("/v1/diagnostics/node")
def node_diagnostics(request: Request) -> dict[str, Any]:
    return _local(request)


@router.get("/v1/diagnostics/cluster/{node_id}")
async def member_diagnostics(request: Request, node_id: str) -> dict[str, Any]:
    context = request.app.state.skulk
    if node_id == context.node_id:
        return _local(request)
    info = context.get_state().nodes.get(node_id)
    if info is None:
        raise NotFound(f"no member {node_id} in this cluster; see GET /v1/cluster", code="unknown_node")
    if not info.api_endpoint:
        raise PeerUnreachable(f"member {node_id} advertises no API endpoint")
    headers = {"Authorization": f"Bearer {context.api_key}"} if context.api_key else {}
    try:
        async with httpx.AsyncClient(timeout=PEER_DIAGNOSTICS_TIMEOUT_S) as client:
            response = await client.get(info.api_endpoint.rstrip("/") + "/v1/diagnostics/node", headers=headers)
    except httpx.HTTPError as exc:
        raise PeerUnreachable(f"member {node_id} at {info.api_endpoint} did not answer: {exc!r}") from None
    if response.status_code != 200:
        raise PeerUnreachable(f"member {node_id} at {info.api_endpoint} answered {response.status_code}")
    return response.json()
