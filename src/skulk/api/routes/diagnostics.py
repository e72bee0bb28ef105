"""Diagnostics routes: what this node's bounded queues, logs and leases are doing, the same
gathered from every member (`/v1/diagnostics/cluster`), and Prometheus metrics."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict

from skulk.api.context import ApiContext, api_context
from skulk.api.errors import Conflict, NotFound, PeerUnreachable
from skulk.api.routes import realtime
from skulk.observe.cluster_diagnostics import (
    NODE_REPORT_PATH,
    PeerAnswer,
    cluster_report,
    cluster_timeline,
    gather_from_peers,
)
from skulk.observe.metrics import CONTENT_TYPE, exposition

router = APIRouter()


def _own_report(context: ApiContext) -> dict[str, Any]:
    return {"nodeId": context.node_id, "nodeName": context.node_name, **context.get_diagnostics(),
            "eventStreams": context.state_feed.stats(), "realtime": realtime.stats()}


@router.get("/v1/diagnostics/node")
def node_diagnostics(request: Request) -> dict[str, Any]:
    return _own_report(api_context(request))


LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]


class LogLevelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: LogLevel


@router.get("/v1/diagnostics/log-level")
def get_log_level(request: Request) -> dict[str, str]:
    """This node's log level now (SKULK_LOG_LEVEL at start, or what was PUT since)."""
    context = api_context(request)
    if context.log_level is None:
        raise Conflict("this API runs outside a node: it has no log level", code="no_log_level")
    return {"level": context.log_level.get()}


@router.put("/v1/diagnostics/log-level")
def put_log_level(request: Request, body: LogLevelBody) -> dict[str, str]:
    """Change this node's log level until it restarts (SKULK_LOG_LEVEL then applies again)."""
    context = api_context(request)
    if context.log_level is None:
        raise Conflict("this API runs outside a node: it has no log level", code="no_log_level")
    context.log_level.set(body.level)
    return {"level": context.log_level.get()}


@router.get("/v1/diagnostics/cluster")
async def cluster_diagnostics(request: Request) -> dict[str, Any]:
    """Every member's own diagnostics, gathered now with a deadline per member; a member
    that does not answer is listed under `unreachable` with the reason."""
    context = api_context(request)
    urls = context.get_peer_urls()
    answers = await gather_from_peers(urls, NODE_REPORT_PATH, api_key=context.peer_credential)
    for node_id, reason in context.get_lost_members().items():
        if node_id not in urls:
            answers[node_id] = PeerAnswer(error=f"left the cluster: {reason}")
    return cluster_report(context.node_id, _own_report(context), answers, context.get_state())


@router.get("/v1/diagnostics/cluster/timeline")
async def cluster_timeline_route(request: Request) -> dict[str, Any]:
    """Every reachable member's flight recorder merged into one wall-clock-ordered timeline
    (declared before `/{node_id}`: node ids are never "timeline")."""
    report = await cluster_diagnostics(request)
    return {"nodeId": report["nodeId"], "unreachable": report["unreachable"], "records": cluster_timeline(report)}


@router.get("/v1/diagnostics/cluster/{node_id}")
async def member_diagnostics(request: Request, node_id: str) -> dict[str, Any]:
    """One member's own diagnostics, asked through this node (404: not a member; 502: it did
    not answer in time)."""
    context = api_context(request)
    if node_id == context.node_id:
        return _own_report(context)
    urls = context.get_peer_urls()
    if node_id not in urls:
        raise NotFound(f"No member {node_id!r} in this node's view of the cluster (see GET /v1/cluster).",
                       code="unknown_node")
    answer = (await gather_from_peers({node_id: urls[node_id]}, NODE_REPORT_PATH, api_key=context.peer_credential))[node_id]
    if not answer.reachable:
        raise PeerUnreachable(node_id, answer.error or "no answer")
    return answer.body


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """Prometheus text exposition of this node's metrics (see `skulk.observe.metrics`)."""
    return Response(exposition(request.app.state.metrics.registry), media_type=CONTENT_TYPE)
