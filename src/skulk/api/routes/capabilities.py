"""Capability providers over HTTP (docs/PROVIDERS.md); inference routes, native error JSON.

`GET /v1/capabilities`: every capability each node in the cluster serves, with its node,
id, version, revision, I/O mode and schemas. This node's come from its registry; every
other node is asked over the fabric with a deadline, and a node that does not answer is
listed under `unreachable`, never failing the listing.

`POST /v1/capabilities/{id}/call` with `{"node", "version", "revision", "input", "timeoutS"}`:
one call on that node, pinned to the revision read from the listing. A unary capability
answers JSON `{"node", "id", "version", "output"}`; a server-streaming one answers SSE, one
`chunk` event per output chunk (`{"seq", "output"}`) and exactly one terminal event
(`completed`, `failed` or `cancelled`, the last two with the typed error). A client that
disconnects cancels the call at the provider. Client- and bidirectional streaming have no
HTTP surface yet: they are refused `mode_unsupported` (400) before the provider runs; use
`call_capability` in-process. Thin: the fabric decides and carries everything.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue
from pydantic.alias_generators import to_camel

from skulk.api.context import ApiContext, api_context
from skulk.api.errors import ApiError, ErrorKind
from skulk.extensions.providers.bounds import DEFAULT_CALL_TIMEOUT_S, DESCRIBE_TIMEOUT_S, MAX_CALL_TIMEOUT_S
from skulk.extensions.providers.client import CapabilityCall
from skulk.extensions.providers.errors import ERROR_KINDS, CapabilityError
from skulk.extensions.providers.fabric import ProviderFabric

router = APIRouter()
logger = logging.getLogger(__name__)

LIST_PATH = "/v1/capabilities"
CALL_PATH = "/v1/capabilities/{capability_id}/call"
HTTP_IO_MODES = ("unary", "server_streaming")
"""The modes the HTTP call drives: one input value, a result or a stream of output chunks."""


class CapabilityCallFailed(ApiError):
    """A capability call's typed failure: `code` is its kind (`input_invalid`, ...)."""

    def __init__(self, error: CapabilityError) -> None:
        super().__init__(error.message, code=error.kind, param="input" if error.kind == "input_invalid" else None)
        self.kind: ErrorKind = ERROR_KINDS[error.kind]
        self.node = error.node


class CapabilitiesUnavailable(ApiError):
    kind = "unavailable"
    default_code = "capabilities_unavailable"


class CallBody(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    node: str = Field(min_length=1, max_length=128)
    version: str = Field(min_length=1, max_length=64)
    revision: str = Field(min_length=1, max_length=64)
    input: JsonValue = None
    timeout_s: float = Field(default=DEFAULT_CALL_TIMEOUT_S, gt=0, le=MAX_CALL_TIMEOUT_S)


def _fabric(context: ApiContext) -> ProviderFabric:
    if context.capabilities is None:
        raise CapabilitiesUnavailable("this node runs no capability fabric")
    return context.capabilities


@router.get(LIST_PATH)
async def list_capabilities(request: Request) -> dict[str, Any]:
    context = api_context(request)
    if context.capabilities is None:
        return {"object": "list", "data": [], "unreachable": []}
    fabric = context.capabilities
    nodes = sorted({*context.get_state().nodes, context.node_id})

    async def describe(node: str) -> tuple[str, Any]:
        try:
            return node, await fabric.client.describe(node, DESCRIBE_TIMEOUT_S)
        except CapabilityError as exc:
            return node, exc

    data: list[dict[str, Any]] = []
    unreachable: list[dict[str, Any]] = []
    for node, found in await asyncio.gather(*(describe(node) for node in nodes)):
        if isinstance(found, CapabilityError):
            unreachable.append({"node": node, "code": found.kind, "detail": found.message})
            continue
        data += [{"node": node, **descriptor.listing()} for descriptor in found]
    return {"object": "list", "data": data, "unreachable": unreachable}


@router.post(CALL_PATH, response_model=None)
async def call_capability(capability_id: str, request: Request, body: CallBody) -> dict[str, Any] | StreamingResponse:
    context = api_context(request)
    fabric = _fabric(context)
    try:
        if body.node != context.node_id and body.node not in context.get_state().nodes:
            raise CapabilityError(
                "node_unreachable", f"node {body.node} is not a member of this cluster", node=body.node
            )
        call = await fabric.client.call_capability(
            body.node,
            capability_id,
            body.version,
            body.revision,
            body.input,
            timeout_s=body.timeout_s,
            io_modes=HTTP_IO_MODES,
        )
        mode = await call.wait_started()
        if mode == "unary":
            output = await _unary_result(request, call)
            return {"node": body.node, "id": capability_id, "version": body.version, "output": output}
    except CapabilityError as exc:
        raise CapabilityCallFailed(exc) from None
    return StreamingResponse(
        _events(request, call),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _cancel_on_disconnect(request: Request, call: CapabilityCall) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            break
    logger.info("capability call %s on %s: client disconnected; cancelling", call.call_id, call.node)
    await call.cancel("the HTTP client disconnected")


async def _unary_result(request: Request, call: CapabilityCall) -> Any:
    watcher = asyncio.create_task(_cancel_on_disconnect(request, call))
    try:
        return await call.result()
    finally:
        watcher.cancel()


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _events(request: Request, call: CapabilityCall) -> AsyncIterator[bytes]:
    watcher = asyncio.create_task(_cancel_on_disconnect(request, call))
    seq = 0
    try:
        async for chunk in call.outputs():
            yield _sse("chunk", {"seq": seq, "output": chunk})
            seq += 1
        yield _sse("completed", {"chunks": seq})
    except CapabilityError as exc:
        failure = CapabilityCallFailed(exc)
        yield _sse(
            "cancelled" if exc.kind == "cancelled" else "failed",
            {"detail": exc.message, "errorKind": failure.kind, "code": exc.kind, "node": exc.node},
        )
    finally:
        watcher.cancel()
        if not call.done:
            await call.cancel("the HTTP response ended")
