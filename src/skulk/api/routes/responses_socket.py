"""The Responses API's WebSocket mode: `GET /v1/responses` upgraded to a WebSocket.

A client keeps one socket open for a whole agent loop and sends `response.create` events
(the POST body's fields, flat, with `"type": "response.create"`); each is answered with the
same events a streamed POST sends, one JSON text frame each, in order. Turns run one at a
time, in the order sent (at most `MAX_QUEUED_TURNS` wait). A turn continues an earlier one
with `previous_response_id`: the responses this socket produced are kept on the socket (the
last `SOCKET_KEPT_RESPONSES`) even with `store: false`, so a client that stores nothing can
still chain turns; others come from the response store as over HTTP.

Bad input gets an `error` event and changes nothing; the socket stays open. A browser page
from an origin the node does not allow cannot open it (the policy CORS applies to HTTP),
an oversized frame is refused, and an idle socket is closed after `IDLE_TIMEOUT_S`. Closing
the socket cancels the turn in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections import OrderedDict
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from skulk.api.adapters import openai_responses
from skulk.api.chat_middleware import observed, transformed
from skulk.api.context import api_context
from skulk.api.cors import LOCAL_ORIGIN_REGEX
from skulk.api.errors import ApiError, InvalidRequest, StreamFailed, invalid_request_from_validation
from skulk.api.generation import SocketChannel, drive, fetched_images, for_placed_model, start_generation
from skulk.api.response_store import StoredResponse
from skulk.api.routes.openai import RESPONSES_PARAMS, caller_scope, kept_responses, stored_response
from skulk.shared.types.common import ChatMessage

logger = logging.getLogger(__name__)

router = APIRouter()

IDLE_TIMEOUT_S = 600.0
"""A socket with no turn in flight and nothing sent for this long is closed (code 1000)."""
MAX_QUEUED_TURNS = 4
"""`response.create` events waiting behind the turn in flight; one more is refused."""
SOCKET_KEPT_RESPONSES = 16
"""Responses a socket remembers for `previous_response_id`, whatever their `store`."""
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_NORMAL = 1000


def origin_allowed(origin: str | None, extra_origins: tuple[str, ...]) -> bool:
    """Whether a WebSocket from `origin` may open: no Origin (not a browser), a page on this
    machine, or an origin the operator allowed for CORS."""
    if origin is None:
        return True
    origin = origin.rstrip("/")
    if re.match(LOCAL_ORIGIN_REGEX, origin):
        return True
    return "*" in extra_origins or origin in {o.rstrip("/") for o in extra_origins}


def error_event(code: str | None, message: str, param: str | None = None) -> str:
    """An `error` event in the Responses stream's shape."""
    return json.dumps({"type": "error", "code": code, "message": message, "param": param},
                      separators=(",", ":"), ensure_ascii=False)


def parse_turn(text: str) -> openai_responses.ResponsesRequest:
    """A `response.create` frame as a request, or the ApiError naming what is wrong."""
    try:
        event = json.loads(text)
    except ValueError:
        raise InvalidRequest("The frame is not JSON.", code="invalid_json") from None
    if not isinstance(event, dict) or event.get("type") != "response.create":
        raise InvalidRequest("Send 'response.create' events (the POST /v1/responses body with "
                             '"type": "response.create").', param="type", code="unknown_event")
    fields = {k: v for k, v in event.items() if k not in ("type", "stream", "stream_id")}
    try:
        return openai_responses.ResponsesRequest.model_validate(fields)
    except ValidationError as error:
        raise invalid_request_from_validation(error) from None


class _Socket:
    """One open socket: its queued turns, its kept responses, its single writer."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.turns: asyncio.Queue[str | None] = asyncio.Queue(MAX_QUEUED_TURNS)
        self.closed = asyncio.Event()
        self.kept: OrderedDict[str, StoredResponse] = OrderedDict()
        self._send_lock = asyncio.Lock()

    async def send(self, frame: str) -> None:
        async with self._send_lock:
            await self.websocket.send_text(frame)

    def keep(self, response_id: str, stored: StoredResponse) -> None:
        self.kept[response_id] = stored
        self.kept.move_to_end(response_id)
        while len(self.kept) > SOCKET_KEPT_RESPONSES:
            self.kept.popitem(last=False)

    async def read(self, max_bytes: int) -> None:
        """Frames into the turn queue until the socket closes (then None)."""
        try:
            while True:
                text = await self.websocket.receive_text()
                if len(text.encode()) > max_bytes:
                    await self.websocket.close(CLOSE_TOO_BIG, f"a frame is limited to {max_bytes} bytes")
                    return
                try:
                    self.turns.put_nowait(text)
                except asyncio.QueueFull:
                    await self.send(error_event("too_many_turns", f"At most {MAX_QUEUED_TURNS} response.create "
                                                "events may wait behind the one in flight; send it again later."))
        except (WebSocketDisconnect, RuntimeError):
            return
        finally:
            self.closed.set()
            with contextlib.suppress(asyncio.QueueFull):
                self.turns.put_nowait(None)


@router.websocket("/v1/responses")
async def responses_socket(websocket: WebSocket) -> None:
    context = api_context(websocket)
    if not origin_allowed(websocket.headers.get("origin"), context.cors_origins):
        await websocket.close(CLOSE_POLICY, "this origin may not open a WebSocket here")
        return
    await websocket.accept()
    socket = _Socket(websocket)
    reader = asyncio.create_task(socket.read(context.limits.max_body_bytes))
    try:
        while True:
            try:
                text = await asyncio.wait_for(socket.turns.get(), IDLE_TIMEOUT_S)
            except TimeoutError:
                await websocket.close(CLOSE_NORMAL, f"idle for {IDLE_TIMEOUT_S:.0f} s")
                return
            if text is None:
                return
            try:
                await _turn(websocket, socket, parse_turn(text))
            except ApiError as error:
                await socket.send(error_event(error.code, error.message, error.param))
    except (WebSocketDisconnect, RuntimeError):
        return  # the client went away mid-send
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def _history(websocket: WebSocket, socket: _Socket, response_id: str) -> tuple[ChatMessage, ...]:
    kept = socket.kept.get(response_id)
    if kept is not None:
        return kept.conversation
    return (await stored_response(websocket, response_id, "previous_response_id")).conversation


async def _turn(websocket: WebSocket, socket: _Socket, body: openai_responses.ResponsesRequest) -> None:
    """One response, streamed as frames. ApiErrors before the first event propagate."""
    context = api_context(websocket)
    history = await _history(websocket, socket, body.previous_response_id) if body.previous_response_id else ()
    fetched = await fetched_images(context, body.model, openai_responses.image_urls(body), "input")
    params = for_placed_model(context, openai_responses.to_params(body, history, fetched)).model_copy(
        update={"stream": True})
    sent = await transformed(context, params)  # the stored conversation keeps the caller's own
    stream = await start_generation(context, sent, max_tokens_param="max_output_tokens",
                                    param_names=RESPONSES_PARAMS)
    scope = caller_scope(websocket)

    def keep(response: dict[str, Any]) -> None:
        if response["status"] not in ("completed", "incomplete"):
            return
        stored = StoredResponse(scope, time.monotonic(), response,
                                openai_responses.conversation_of(params, body, response))
        socket.keep(response["id"], stored)
        if body.store is not False:
            kept_responses(websocket).put(response["id"], stored)

    encoder = openai_responses.ResponseStreamEncoder(command_id=stream.command_id, request=body,
                                                     created=int(time.time()), on_done=keep,
                                                     clock=lambda: int(time.time()), sse=False)
    for frame in encoder.start():
        await socket.send(frame)
    try:
        async with aclosing(observed(context, drive(SocketChannel(socket.closed), context, stream, sent),
                                     wire="openai.responses", request_id=stream.command_id,
                                     model_id=sent.model_id)) as chunks:
            async for chunk in chunks:
                for frame in encoder.chunk_to_sse(chunk):
                    await socket.send(frame)
    except StreamFailed as failure:
        logger.info("command %s ended: %s (%s)", stream.command_id, failure.error_type, failure.message)
        for frame in encoder.error_events(failure):
            await socket.send(frame)
        return
    for frame in encoder.finish():
        await socket.send(frame)


__all__ = ["IDLE_TIMEOUT_S", "MAX_QUEUED_TURNS", "SOCKET_KEPT_RESPONSES", "error_event", "origin_allowed",
           "parse_turn", "router"]
