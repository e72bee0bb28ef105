"""WS /v1/fabric/chains/speech: the realtime voice bridge as an explicit composition.

The socket is `skulk.api.routes.realtime.serve` (origin, API key, admission, the session
loop, transcription through the cluster, the response step, barge-in, cancellation, idle
close), configured differently: its FIRST frame must be a typed `session.update` naming
the participants (`skulk.api.realtime.chains`: `stt` required, optional `chat`, `tts` and
its voice). A first frame that is missing, malformed or names what the cluster cannot run
is answered with one `error` event in the realtime dialect's shape and the socket is
closed with 1008 (policy violation). After it, the socket speaks exactly as `/v1/realtime`
(a later `session.update` restates the whole composition). This module must never grow a
second session loop.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, WebSocket

from skulk.api.context import ApiContext
from skulk.api.generation import placed_model
from skulk.api.realtime.chains import chain_refusal, chain_settings, chain_update
from skulk.api.realtime.session import Session, SessionRefused, SessionSettings, error_event
from skulk.api.routes.realtime import CLOSE_POLICY, serve
from skulk.shared.types.ids import new_id

router = APIRouter()

FIRST_FRAME_TIMEOUT_S = 30.0
"""How long an admitted chain socket may take to send its session update before it is
refused (it holds a session slot meanwhile)."""


def check(context: ApiContext, settings: SessionSettings) -> SessionRefused | None:
    """`chain_refusal` against this cluster's cards and placed models now."""
    placed = frozenset(instance.model_id for instance in context.list_instances())
    return chain_refusal(settings, context.get_cards(), placed, lambda name: placed_model(context, name))


async def _refuse(websocket: WebSocket, refused: SessionRefused) -> None:
    await websocket.send_text(json.dumps(error_event(f"event_{new_id()}", refused.code, refused.message,
                                                     refused.param)))
    await websocket.close(CLOSE_POLICY, refused.code)


async def open_chain(websocket: WebSocket, context: ApiContext) -> Session | None:
    """The session the first frame composes, or None once it has been refused."""
    try:
        async with asyncio.timeout(FIRST_FRAME_TIMEOUT_S):
            text = await websocket.receive_text()
    except TimeoutError:
        await _refuse(websocket, SessionRefused("session_update_missing", "The chain's first frame is a "
                                                f"'session.update'; none came within {FIRST_FRAME_TIMEOUT_S:.0f} s.",
                                                "type"))
        return None
    try:
        event: object = json.loads(text)
    except ValueError:
        event = None
    try:
        settings = chain_settings(event)
        if (refused := check(context, settings)) is not None:
            raise refused
    except SessionRefused as refused:
        await _refuse(websocket, refused)
        return None
    return Session("conversation", settings, lambda s: check(context, s), lambda prefix: f"{prefix}_{new_id()}",
                   beta=False, parse_update=chain_update)


@router.websocket("/v1/fabric/chains/speech")
async def speech_chain_socket(websocket: WebSocket) -> None:
    await serve(websocket, open_chain)


__all__ = ["FIRST_FRAME_TIMEOUT_S", "check", "open_chain", "router"]
