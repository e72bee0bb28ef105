"""Ollama's model-management routes under `/ollama`, mapped onto Skulk's model store.

- `POST /api/pull` fetches the model into the store (the store host downloads it from
  Hugging Face, `skulk.api.routes.store.fetch_step`) and reports Ollama's NDJSON progress
  (`pulling manifest`, `pulling <model>` with total/completed bytes, `success`), or one
  object when `stream` is false. The name is a card id, or an Ollama library name
  (`llama3.2:1b`), `owner/repo[:QUANT]` or `hf.co/owner/repo:QUANT`, whose card is built
  from the hub and added first (`skulk.models.model_names`). Pulling does not place the
  model (`POST /place_instance` does).
- `DELETE /api/delete` removes the model's weights from the store and every node's
  staged copy (`skulk.api.routes.store.delete_model`).
- `POST /api/copy`, `/api/create` and `/api/push` have no Skulk equivalent (models are
  Hugging Face repos described by cards): they answer an Ollama-shaped error that says what
  Skulk does instead, never a bare 404.

Errors render in Ollama's shape (`{"error": "..."}`) like every `/ollama` route.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict

from skulk.api.adapters.ollama import ndjson
from skulk.api.context import api_context
from skulk.api.errors import ApiError, InvalidRequest, StreamFailed, ollama_error_body
from skulk.api.generation import SSE_HEADERS
from skulk.api.openapi_errors import OLLAMA_ERROR_RESPONSES
from skulk.api.routes.model_cards import AddModelBody, build_hub_card, register_card
from skulk.api.routes.store import FetchBody, delete_model, fetch_step
from skulk.model_store.fetch import FETCH_DEADLINE_S, FetchStatus

router = APIRouter(prefix="/ollama", responses=OLLAMA_ERROR_RESPONSES)

PULL_POLL_S = 0.5
"""How often a pull reads the fetch's progress (one progress line each time)."""

PULL_DEADLINE_S = FETCH_DEADLINE_S
"""A pull ends with an error after the store's own fetch deadline (the fetch itself goes on
and a later pull picks it up)."""


class ModelRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    name: str | None = None
    """The older spelling of `model`."""
    stream: bool = True
    insecure: bool | None = None


def _model(body: ModelRequest) -> str:
    model = (body.model or body.name or "").strip()
    if not model:
        raise InvalidRequest("model is required", param="model")
    return model


def _progress(status: FetchStatus) -> dict[str, Any]:
    if status.manifest is not None:  # registered: every byte is there
        total = completed = status.manifest.total_bytes
    else:
        total, completed = status.total_bytes, status.downloaded_bytes
    return {"status": f"pulling {status.model_id}", "digest": status.revision or status.model_id,
            "total": total, "completed": completed}


def _failed(status: FetchStatus) -> StreamFailed:
    return StreamFailed("pull_failed", f"pulling {status.model_id} failed: {status.reason or status.kind}",
                        origin="api")


async def _pull_target(request: Request, typed: str) -> tuple[str, FetchBody | None]:
    """The model id to fetch for what the user typed: a card id as is; an Ollama library
    name (`llama3.2:1b`), `owner/repo:QUANT` or a repo with no card yet gets its card built
    from the hub and added to the cluster first (`skulk.models.model_names`), and the fetch
    carries that card so it need not wait for the master to apply it."""
    if typed in api_context(request).get_cards():
        return typed, None
    card = await build_hub_card(request, AddModelBody(model_id=typed))
    await register_card(request, card)
    return card.model_id, FetchBody(revision=card.source_revision, card=card.to_wire())


async def _follow(request: Request, model: str, status: FetchStatus,
                  fetch: FetchBody | None = None) -> AsyncIterator[FetchStatus]:
    """`status`, then the fetch's status every PULL_POLL_S until it settles or the deadline."""
    deadline = time.monotonic() + PULL_DEADLINE_S
    yield status
    while status.state == "fetching":
        if time.monotonic() > deadline:
            raise StreamFailed("pull_timeout", f"pulling {model} did not finish within {PULL_DEADLINE_S:g}s; "
                               "pull again to follow it", origin="api")
        await asyncio.sleep(PULL_POLL_S)
        status = await fetch_step(request, model, fetch)
        yield status


@router.post("/api/pull", response_model=None)
async def pull(request: Request, body: ModelRequest) -> StreamingResponse | dict[str, Any]:
    model, fetch = await _pull_target(request, _model(body))
    first = await fetch_step(request, model, fetch)  # no store here, no card: an error status, before any line
    if not body.stream:
        async for status in _follow(request, model, first, fetch):
            if status.state == "failed":
                raise _failed(status)
        return {"status": "success"}

    async def lines() -> AsyncIterator[str]:
        yield ndjson({"status": "pulling manifest"})
        try:
            async for status in _follow(request, model, first, fetch):
                if status.state == "failed":
                    raise _failed(status)
                yield ndjson(_progress(status))
        except ApiError as error:
            yield ndjson(ollama_error_body(error))
            return
        yield ndjson({"status": "verifying sha256 digest"})
        yield ndjson({"status": "success"})

    return StreamingResponse(lines(), media_type="application/x-ndjson", headers=SSE_HEADERS)


@router.delete("/api/delete")
async def delete(request: Request, body: ModelRequest) -> Response:
    """Ollama answers an empty 200; Skulk's summary of what it removed rides along as JSON."""
    removed = await delete_model(request, _model(body))
    return JSONResponse(removed)


_INSTEAD = {
    "copy": "Skulk names models by their Hugging Face repo and has no aliases; to serve a model under another "
            "id, add a card for it with POST /models/add.",
    "create": "Skulk does not build models from Modelfiles; add a model card for a Hugging Face repo or a local "
              "directory with POST /models/add, then place it with POST /place_instance.",
    "push": "Skulk does not push models to a registry; models come from Hugging Face into the cluster's store "
            "(POST /ollama/api/pull or POST /store/models/{model}/fetch).",
}
"""What Skulk does instead of each Ollama operation it has no equivalent for."""


def _unsupported(operation: str) -> None:
    raise InvalidRequest(f"/api/{operation} is not supported by Skulk. {_INSTEAD[operation]}",
                         code="unsupported_endpoint")


@router.post("/api/copy")
async def copy() -> None:
    _unsupported("copy")


@router.post("/api/create")
async def create() -> None:
    _unsupported("create")


@router.post("/api/push")
async def push() -> None:
    _unsupported("push")


__all__ = ["PULL_DEADLINE_S", "PULL_POLL_S", "router"]
