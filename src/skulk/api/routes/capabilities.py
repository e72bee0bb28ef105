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
disconnects cancels the call at the provider. Client- and bidirectional streaming are
refused `mode_unsupported` (400) here, before the provider runs: they take the WebSocket.

`WS /v1/capabilities/{id}/socket`: any mode. The first text frame is the POST body; the node
answers `{"type": "started", "ioMode"}` (or a terminal), then one `{"type": "chunk", "seq",
"output"}` frame per output chunk and exactly one terminal frame (`completed` with
`chunks`, or `failed` / `cancelled` with the typed error), then closes. The client sends
`{"type": "input", "input": ...}` per input chunk, `{"type": "complete"}` to half-close its
input, `{"type": "cancel"}` to cancel; closing the socket cancels the call.
Thin: the fabric decides and carries everything.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError
from pydantic.alias_generators import to_camel

from skulk.api.context import ApiContext, api_context
from skulk.api.errors import ApiError, ErrorKind, invalid_request_from_validation
from skulk.api.routes.responses_socket import origin_allowed
from skulk.extensions.providers.bounds import (
    DEFAULT_CALL_TIMEOUT_S,
    DESCRIBE_TIMEOUT_S,
    MAX_CALL_TIMEOUT_S,
    MAX_CHUNK_BYTES,
    MAX_INPUT_BYTES,
)
from skulk.extensions.providers.client import CapabilityCall
from skulk.extensions.providers.errors import ERROR_KINDS, CapabilityError
from skulk.extensions.providers.fabric import ProviderFabric

router = APIRouter()
logger = logging.getLogger(__name__)

LIST_PATH = "/v1/capabilities"
CALL_PATH = "/v1/capabilities/{capability_id}/call"
SOCKET_PATH = "/v1/capabilities/{capability_id}/socket"
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


def _check_member(context: ApiContext, node: str) -> None:
    if node != context.node_id and node not in context.get_state().nodes:
        raise CapabilityError("node_unreachable", f"node {node} is not a member of this cluster", node=node)


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
async def call_capability(
    capability_id: str, request: Request, fields: dict[str, Any]
) -> dict[str, Any] | StreamingResponse:
    try:
        body = CallBody.model_validate(fields)
    except ValidationError as exc:
        raise invalid_request_from_validation(exc) from None
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


# -- the WebSocket: every mode ---------------------------------------------------------------

OPEN_FRAME_TIMEOUT_S = 10.0
"""How long a new socket may wait before sending its call (the first frame)."""

MAX_SOCKET_FRAME_BYTES = max(MAX_INPUT_BYTES, MAX_CHUNK_BYTES) + 64 * 1024
"""Largest text frame a client may send: an input value or chunk plus its framing."""

CLOSE_NORMAL, CLOSE_POLICY, CLOSE_TOO_BIG = 1000, 1008, 1009


def _error_frame(error: CapabilityError) -> dict[str, Any]:
    return {
        "type": "cancelled" if error.kind == "cancelled" else "failed",
        "detail": error.message,
        "errorKind": ERROR_KINDS[error.kind],
        "code": error.kind,
        "node": error.node,
    }


async def _read_call(websocket: WebSocket) -> CallBody:
    try:
        async with asyncio.timeout(OPEN_FRAME_TIMEOUT_S):
            text = await websocket.receive_text()
    except TimeoutError:
        raise CapabilityError("input_invalid", f"no call within {OPEN_FRAME_TIMEOUT_S:g} s of opening") from None
    if len(text.encode()) > MAX_SOCKET_FRAME_BYTES:
        raise CapabilityError("payload_too_large", f"a frame is limited to {MAX_SOCKET_FRAME_BYTES} bytes")
    try:
        return CallBody.model_validate_json(text)
    except ValidationError as exc:
        raise CapabilityError("input_invalid", f"the call frame is not a call: {exc.errors()[0]['msg']}") from None


async def _feed(websocket: WebSocket, call: CapabilityCall) -> None:
    """The client's frames into the call until the socket closes (which cancels the call)."""
    try:
        while True:
            text = await websocket.receive_text()
            try:
                if len(text.encode()) > MAX_SOCKET_FRAME_BYTES:
                    raise CapabilityError("payload_too_large", f"a frame is limited to {MAX_SOCKET_FRAME_BYTES} bytes")
                frame = json.loads(text)
                kind = frame.get("type") if isinstance(frame, dict) else None
                if kind == "input":
                    await call.send(frame.get("input"))
                elif kind == "complete":
                    await call.complete()
                elif kind == "cancel":
                    await call.cancel("the client cancelled the call")
                    return
                else:
                    raise CapabilityError("input_invalid", 'a frame is {"type": "input" | "complete" | "cancel"}')
            except (ValueError, CapabilityError) as exc:
                error = (
                    exc if isinstance(exc, CapabilityError) else CapabilityError("input_invalid", f"not JSON: {exc}")
                )
                call.fail(error, cancel=True)
                return
    except (WebSocketDisconnect, RuntimeError):
        await call.cancel("the client closed the socket")


@router.websocket(SOCKET_PATH)
async def capability_socket(websocket: WebSocket, capability_id: str) -> None:
    context = api_context(websocket)
    if not origin_allowed(websocket.headers.get("origin"), context.cors_origins):
        await websocket.close(CLOSE_POLICY, "this origin may not open a WebSocket here")
        return
    await websocket.accept()
    call: CapabilityCall | None = None
    feeder: asyncio.Task[None] | None = None
    try:
        try:
            if context.capabilities is None:
                raise CapabilityError("node_unreachable", "this node runs no capability fabric")
            body = await _read_call(websocket)
            _check_member(context, body.node)
            call = await context.capabilities.client.call_capability(
                body.node, capability_id, body.version, body.revision, body.input, timeout_s=body.timeout_s
            )
            mode = await call.wait_started()
            await websocket.send_json({"type": "started", "ioMode": mode})
            feeder = asyncio.create_task(_feed(websocket, call))
            seq = 0
            async for chunk in call.outputs():
                await websocket.send_json({"type": "chunk", "seq": seq, "output": chunk})
                seq += 1
            terminal: dict[str, Any] = {"type": "completed", "chunks": seq}
        except CapabilityError as exc:
            terminal = _error_frame(exc)
        await websocket.send_json(terminal)
        await websocket.close(CLOSE_NORMAL)
    except (WebSocketDisconnect, RuntimeError):
        pass  # the client left: the call is cancelled below
    finally:
        if feeder is not None:
            feeder.cancel()
        if call is not None and not call.done:
            await call.cancel("the socket closed")
