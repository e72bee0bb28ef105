"""Trace routes: `GET /v1/traces` (traces the cluster holds, newest first) and
`GET /v1/traces/{traceId}` (one trace as Chrome trace-event JSON, gathered from every node
that holds a part of it; open it in Perfetto or chrome://tracing).

`?scope=local` answers with this node's own listing or part only: what the asking node
gathers from its peers (`skulk.observe.peer_http`)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request

from skulk.api.context import ApiContext, api_context
from skulk.api.errors import NotFound
from skulk.observe.cluster_diagnostics import gather_from_peers
from skulk.observe.traces import chrome_trace, merge_listings, valid_trace_id

router = APIRouter()

Scope = Literal["cluster", "local"]


def _store(context: ApiContext):
    store = getattr(context, "traces", None)
    if store is None:
        raise NotFound("This node keeps no traces.", code="trace_not_found")
    return store


@router.get("/v1/traces")
async def list_traces(request: Request, scope: Scope = "cluster") -> dict[str, Any]:
    context = api_context(request)
    own = _store(context).listing()
    if scope == "local":
        return {"nodeId": context.node_id, "traces": own}
    answers = await gather_from_peers(context.get_peer_urls(), "/v1/traces?scope=local", api_key=context.peer_credential)
    listings = [own] + [a.body.get("traces", []) for a in answers.values() if a.reachable and isinstance(a.body, dict)]
    return {"traces": merge_listings(listings), "unreachable": sorted(n for n, a in answers.items() if not a.reachable)}


def _not_found(trace_id: str) -> NotFound:
    return NotFound(f"No node holds a trace {trace_id!r} (tracing off when it ran, or pruned; see GET /v1/traces).",
                    code="trace_not_found")


@router.get("/v1/traces/{trace_id}")
async def get_trace(request: Request, trace_id: str, scope: Scope = "cluster") -> dict[str, Any]:
    context = api_context(request)
    store = _store(context)
    if not valid_trace_id(trace_id):
        raise _not_found(trace_id)
    own = store.part(trace_id)
    if scope == "local":
        if own is None:
            raise _not_found(trace_id)
        return own
    answers = await gather_from_peers(context.get_peer_urls(), f"/v1/traces/{trace_id}?scope=local",
                                      api_key=context.peer_credential)
    parts = [own] if own is not None else []
    unreachable = []
    for node_id, answer in sorted(answers.items()):
        if answer.reachable and isinstance(answer.body, dict):
            parts.append(answer.body)
        elif answer.status != 404:  # a 404 is a live node that holds no part of this trace
            unreachable.append(node_id)
    if not parts:
        raise _not_found(trace_id)
    return chrome_trace(trace_id, parts, unreachable)
