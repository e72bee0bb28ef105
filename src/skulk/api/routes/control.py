"""Skulk-native control routes: node identity, the replicated State, the cluster summary."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict

from skulk.api.context import api_context
from skulk.observe.downloads import download_report
from skulk.shared.apply import state_hash
from skulk.shared.health import derive_node_health
from skulk.shared.types.commands import SetTracingEnabled
from skulk.shared.types.ids import CommandId, new_id

router = APIRouter()

ALIVE_HEARTBEAT_AGE_S = 10.0
"""A node counts as alive in `/v1/cluster` while its last heartbeat is younger than this
(the master warns at the same gap and prunes at 30 s)."""


def _context(request: Request):
    return api_context(request)


@router.get("/node_id")
def get_node_id(request: Request) -> dict[str, str]:
    return {"nodeId": _context(request).node_id}


@router.get("/state")
def get_state(request: Request) -> dict[str, Any]:
    """Full replicated State (camelCase), the live telemetry overlay, derived node health, and
    download/staging progress (bytes, rate, ETA per node and model)."""
    return state_body(_context(request))


def state_body(context) -> dict[str, Any]:
    """The body of `GET /state` (also the `state` of every `/v1/events` snapshot)."""
    state = context.get_state()
    telemetry = context.get_telemetry()
    body = state.to_wire()
    body["nodeResources"] = {
        node: reading.resources.to_wire() for node, reading in sorted(telemetry.nodes.items()) if reading.resources
    }
    health = derive_node_health(state, telemetry, time.monotonic(), datetime.now(UTC))
    body["nodeHealth"] = {node: h.to_wire() for node, h in sorted(health.items())}
    body["downloadProgress"] = download_report(telemetry, state, time.monotonic())
    return body


@router.get("/v1/cluster")
def get_cluster(request: Request) -> dict[str, Any]:
    return cluster_body(_context(request))


def cluster_body(context) -> dict[str, Any]:
    """The body of `GET /v1/cluster` (also the `cluster` of every `/v1/events` snapshot)."""
    state = context.get_state()
    telemetry = context.get_telemetry()
    master_id, session_id = context.get_master()
    now = time.monotonic()
    nodes = []
    for node_id, info in sorted(state.nodes.items()):
        reading = telemetry.nodes.get(node_id)
        resources = reading.resources if reading else None
        heartbeat_age = now - reading.heartbeat_at if reading and reading.heartbeat_at is not None else None
        alive = node_id == context.node_id or (heartbeat_age is not None and heartbeat_age < ALIVE_HEARTBEAT_AGE_S)
        nodes.append({
            "nodeId": node_id,
            "name": info.node_name,
            "alive": alive,
            "backends": list(resources.backends) if resources else [],
            "engineProvision": resources.engine_provision.model_dump(mode="json", by_alias=True)
            if resources and resources.engine_provision else None,
            "memory": {
                "total": resources.memory.ram_total_bytes if resources else None,
                "available": resources.memory.ram_available_bytes if resources else None,
            },
        })
    return {
        "nodeId": context.node_id,
        "masterNodeId": master_id,
        "sessionId": session_id,
        "stateHash": state_hash(state),
        "lastEventIdx": state.last_event_applied_idx,
        "nodes": nodes,
    }


class TracingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool


@router.put("/v1/tracing", status_code=202)
async def put_tracing(request: Request, body: TracingRequest) -> dict[str, Any]:
    """Flip the cluster-wide tracing flag (an ordered decision: it goes through the master)."""
    command = SetTracingEnabled(command_id=CommandId(new_id()), enabled=body.enabled)
    await _context(request).submit_command(command)
    return {"commandId": command.command_id, "enabled": body.enabled}


@router.get("/v1/tracing")
def get_tracing(request: Request) -> dict[str, bool]:
    return {"enabled": _context(request).get_state().tracing_enabled}
