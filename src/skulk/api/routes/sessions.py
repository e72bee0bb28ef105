"""`/v1/sessions`: open a session on a placed model, describe it, ensure a prefix, prefill a
suffix, decode (streamed or not), snapshot, restore, branch, close.

The decisions are `skulk.api.sessions`; this module moves data: each model call is an
ordinary generation of the session's whole transcript as a raw prompt (so it reaches the
rank-0 runner the usual way, its text relayed outside State), whose KV the engine's prefix
cache keeps hot between calls. Errors use the OpenAI error shape, like every `/v1` route.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from skulk.api.auth import current_principal
from skulk.api.context import api_context
from skulk.api.errors import InvalidRequest, ModelNotFound, NotFound, StreamFailed
from skulk.api.generation import drive, open_output, start_generation
from skulk.api.sessions import (
    Session,
    SessionBook,
    appended,
    new_session_id,
    parse_snapshot,
    session_refusal,
    snapshot_document,
    valid_session_id,
)
from skulk.datadir.atomic_file import write_atomic
from skulk.shared.prefix_cache import cold_budget_bytes
from skulk.shared.types.common import Usage
from skulk.shared.types.ids import ModelId
from skulk.shared.types.tasks import TextGenerationParams

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class OpenBody(_Body):
    model: str
    prefix: str = ""
    """Text to hold from the start (prefilled at once when not empty)."""


class TextBody(_Body):
    text: str


class DecodeBody(_Body):
    max_tokens: int = Field(default=64, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = None
    stop: list[str] = []
    stream: bool = False


class RestoreBody(_Body):
    snapshot_id: str | None = None
    """A snapshot taken on this node (read from its data dir)."""
    snapshot: dict[str, Any] | None = None
    """A snapshot document, as `POST .../snapshot` returned it (from any node)."""


def _book(request: Request) -> SessionBook:
    app = request.app
    if not hasattr(app.state, "sessions"):
        app.state.sessions = SessionBook()
    return app.state.sessions


def _snapshot_dir(request: Request) -> Path | None:
    return getattr(api_context(request), "sessions_dir", None)


def _usable(request: Request, session_id: str) -> Session:
    session = _book(request).get(session_id)
    instance = api_context(request).find_instance(session.model_id) if session is not None else None
    refusal = session_refusal(session, session_id, current_principal(), instance)
    if refusal is not None:
        raise refusal
    assert session is not None
    return session


def _describe(request: Request, session: Session) -> dict[str, Any]:
    instance = api_context(request).find_instance(session.model_id)
    capacity = instance.capacity if instance is not None else None
    planned = capacity.cold_budget_bytes if capacity is not None else None
    return {
        "id": session.session_id,
        "object": "session",
        "model": session.model_id,
        "instanceId": session.instance_id,
        "contextTokens": instance.context_token_limit if instance is not None else None,
        "hotKvTokens": capacity.hot_kv_tokens if capacity is not None else None,
        "coldBudgetBytes": cold_budget_bytes(planned, os.environ),
        "tokensHeld": session.tokens_held,
        "cachedTokens": session.cached_tokens,
        "transcriptChars": len(session.transcript),
    }


def _params(session: Session, body: DecodeBody, stream: bool) -> TextGenerationParams:
    if not session.transcript:
        raise InvalidRequest("The session holds no text yet; prefill some first.", param="text")
    return TextGenerationParams(
        model_id=ModelId(session.model_id), prompt=session.transcript, max_tokens=body.max_tokens,
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed, stop=body.stop,
        stream=stream,
    )


async def _run(request: Request, session: Session, body: DecodeBody) -> tuple[str, str | None, Usage | None]:
    """One generation of the session's transcript, collected: (text, finish reason, usage)."""
    context = api_context(request)
    params = _params(session, body, stream=False)
    stream = await start_generation(context, params)
    parts: list[str] = []
    finish: str | None = None
    usage: Usage | None = None
    async with aclosing(drive(request, context, stream)) as chunks:
        async for chunk in chunks:
            parts.append(chunk.text)
            finish = chunk.finish_reason or finish
            usage = chunk.usage or usage
    return "".join(parts), finish, usage


def _held(session: Session, usage: Usage | None, keep_output: bool) -> Session:
    if usage is None:
        return session
    held = usage.prompt_tokens + (usage.completion_tokens if keep_output else 0)
    return Session(session.session_id, session.model_id, session.instance_id, session.owner, session.transcript,
                   held, usage.cached_tokens)


async def _prefill(request: Request, session: Session) -> Session:
    """Evaluate the transcript now (a one-token generation whose output is dropped), so the
    next call finds its KV hot."""
    _, _, usage = await _run(request, session, DecodeBody(max_tokens=1, temperature=0))
    return _held(session, usage, keep_output=False)


def _open(request: Request, model_id: str, transcript: str, session_id: str | None = None) -> Session:
    instance = api_context(request).find_instance(model_id)
    if instance is None:
        raise ModelNotFound(model_id)
    return Session(session_id or new_session_id(), model_id, str(instance.instance_id), current_principal().id,
                   transcript)


@router.post("/v1/sessions")
async def open_session(request: Request, body: OpenBody) -> dict[str, Any]:
    """Open a session on the placed model (fenced to the instance it binds now)."""
    session = _open(request, body.model, "")
    if body.prefix:
        session = await _prefill(request, appended(session, body.prefix))
    _book(request).put(session)
    return _describe(request, session)


@router.get("/v1/sessions/{session_id}")
async def describe_session(request: Request, session_id: str) -> dict[str, Any]:
    return _describe(request, _usable(request, session_id))


@router.post("/v1/sessions/{session_id}/prefix")
async def ensure_prefix(request: Request, session_id: str, body: TextBody) -> dict[str, Any]:
    """Make the session hold exactly `text` (what it held before that `text` does not start
    with is dropped; the engine re-uses the KV of the common prefix) and prefill it."""
    session = _usable(request, session_id)
    session = Session(session.session_id, session.model_id, session.instance_id, session.owner)
    session = await _prefill(request, appended(session, body.text))
    _book(request).put(session)
    return _describe(request, session)


@router.post("/v1/sessions/{session_id}/prefill")
async def prefill_suffix(request: Request, session_id: str, body: TextBody) -> dict[str, Any]:
    """Append `text` to the session and evaluate it now."""
    session = await _prefill(request, appended(_usable(request, session_id), body.text))
    _book(request).put(session)
    return _describe(request, session)


@router.post("/v1/sessions/{session_id}/decode", response_model=None)
async def decode(request: Request, session_id: str, body: DecodeBody) -> StreamingResponse | dict[str, Any]:
    """Generate from the session's transcript; the output joins the transcript. Streamed as
    server-sent events (`{"type": "token", "text"}` ... `{"type": "done", ...}`) with
    `stream: true`."""
    session = _usable(request, session_id)
    if not body.stream:
        text, finish, usage = await _run(request, session, body)
        session = _held(appended(session, text), usage, keep_output=True)
        _book(request).put(session)
        return {"text": text, "finishReason": finish, "usage": _usage(usage), "session": _describe(request, session)}
    context = api_context(request)
    stream = await start_generation(context, _params(session, body, stream=True))
    output = await open_output(request, context, stream)
    return StreamingResponse(_events(request, session, output), media_type="text/event-stream", headers=SSE_HEADERS)


async def _events(request: Request, session: Session, chunks: AsyncGenerator[Any, None]) -> AsyncIterator[str]:
    parts: list[str] = []
    finish: str | None = None
    usage: Usage | None = None
    try:
        async with aclosing(chunks) as output:
            async for chunk in output:
                parts.append(chunk.text)
                finish = chunk.finish_reason or finish
                usage = chunk.usage or usage
                if chunk.text:
                    yield _sse({"type": "token", "text": chunk.text})
    except StreamFailed as failure:
        yield _sse({"type": "error", "error": {"code": failure.code or failure.error_type, "message": failure.message}})
        return
    current = _book(request).get(session.session_id)
    if current is not None and current.transcript == session.transcript:  # not changed meanwhile
        session = _held(appended(session, "".join(parts)), usage, keep_output=True)
        _book(request).put(session)
    yield _sse({"type": "done", "finishReason": finish, "usage": _usage(usage), "session": _describe(request, session)})


@router.post("/v1/sessions/{session_id}/snapshot")
async def snapshot(request: Request, session_id: str) -> dict[str, Any]:
    """Write the session to this node's data dir and return the snapshot document."""
    session = _usable(request, session_id)
    document = snapshot_document(session)
    directory = _snapshot_dir(request)
    stored = False
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        write_atomic(directory / f"{session.session_id}.json", json.dumps(document))
        stored = True
    return {**document, "stored": stored}


@router.post("/v1/sessions/restore")
async def restore(request: Request, body: RestoreBody) -> dict[str, Any]:
    """Open a new session from a snapshot (by id from this node's data dir, or the document
    itself from any node) on the model's current instance, and prefill it."""
    if (body.snapshot_id is None) == (body.snapshot is None):
        raise InvalidRequest("Give exactly one of snapshotId or snapshot.", param="snapshotId")
    document: Any = body.snapshot
    if body.snapshot_id is not None:
        directory = _snapshot_dir(request)
        path = directory / f"{body.snapshot_id}.json" if directory and valid_session_id(body.snapshot_id) else None
        if path is None or not path.is_file():
            raise NotFound(f"No snapshot {body.snapshot_id!r} on this node.", param="snapshotId",
                           code="snapshot_not_found")
        document = json.loads(path.read_text())
    _, model_id, transcript = parse_snapshot(document)
    session = _open(request, model_id, transcript)
    if transcript:
        session = await _prefill(request, session)
    _book(request).put(session)
    return _describe(request, session)


@router.post("/v1/sessions/{session_id}/branch")
async def branch(request: Request, session_id: str) -> dict[str, Any]:
    """A new session holding the same transcript (its KV is shared through the prefix cache
    until the two diverge)."""
    session = _usable(request, session_id)
    child = Session(new_session_id(), session.model_id, session.instance_id, session.owner, session.transcript,
                    session.tokens_held, session.cached_tokens)
    _book(request).put(child)
    return _describe(request, child)


@router.delete("/v1/sessions/{session_id}")
async def close_session(request: Request, session_id: str) -> dict[str, Any]:
    session = _book(request).get(session_id)
    if session is None or not (session.owner == current_principal().id or current_principal().cancels_any):
        raise NotFound(f"No open session of yours has the id {session_id!r}.", param="session_id",
                       code="session_not_found")
    _book(request).close(session_id)
    return {"id": session_id, "object": "session", "closed": True}


def _usage(usage: Usage | None) -> dict[str, int] | None:
    if usage is None:
        return None
    return {"promptTokens": usage.prompt_tokens, "completionTokens": usage.completion_tokens,
            "cachedTokens": usage.cached_tokens}


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


__all__ = ["router"]
