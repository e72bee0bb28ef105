"""The model store's HTTP surface on the node API: storage, manifests, file serving for
staging, deleting a model cluster-wide, purging staged copies.

- `GET /store/storage`: per-node breakdown (canonical, staged and resumable bytes, free
  disk, the reserve); this node measured, other members from their disk telemetry.
- `GET /store/models`: the store's registered models (one manifest per revision on disk).
- `GET /store/models/{modelId}?revision=`: one registered manifest, what a staging node
  transfers.
- `GET /store/artifacts/{dirName}/{path}`: one registered file, with Range support so an
  interrupted staging resumes. Only files a registered manifest lists are served: a path
  that is not in it (traversal, markers, anything else under the models dir) is a 404.
- `POST /store/models/{modelId}/fetch` (body `{revision?, card?}`): the store host fetches
  a model it lacks from Hugging Face into its canonical dir, once however many nodes ask;
  answers 200 with the manifest once registered, 202 with progress while fetching, 502 with
  the hub's reason when the fetch failed (`skulk.model_store.fetch`). A staging node polls it.
- `DELETE /store/models/{modelId}`: submits EvictStagedModel (every node drops its staged
  copy) and removes the canonical copy.
- `POST /store/purge-staging`: deletes this node's idle staged copies; the canonical copy
  is never touched.

Errors are `ApiError`s rendered in the OpenAI error shape. The API key middleware covers
these routes like every other. Disk work runs in a worker thread, never on the event loop.
This module never decides eviction (`skulk.model_store.eviction` does) nor assembles copies.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ValidationError

from skulk.api.context import ApiContext, api_context
from skulk.api.errors import ApiError, ClusterNotReady, NotFound
from skulk.model_store.eviction import in_use_model_ids
from skulk.model_store.fetch import FetchStatus, StoreFetcher
from skulk.model_store.node_store import NodeStore, find_registered, registered, registered_file
from skulk.model_store.staging import Manifest, manifest_from_marker, partial_bytes, remove_staged, scan_staged
from skulk.models.companions import companions_of
from skulk.models.downloads import downloaded_models, remove_model
from skulk.shared.types.cards import ModelCard
from skulk.shared.types.commands import EvictStagedModel
from skulk.shared.types.ids import CommandId, ModelId, new_id
from skulk.shared.types.state import DownloadStatusCompleted

router = APIRouter()


StoreContext = NodeStore
"""What the store routes need from the node (`skulk.model_store.node_store.node_store`)."""


class NoStoreHere(NotFound):
    default_code = "no_store_here"

    def __init__(self) -> None:
        super().__init__("This node does not host the model store; send store requests to the store host.")


class StoreModelNotFound(NotFound):
    default_code = "store_model_not_found"

    def __init__(self, model_id: str, revision: str | None = None) -> None:
        at = f" at revision {revision}" if revision else ""
        super().__init__(f"The model store has no registered copy of {model_id!r}{at}.", param="modelId")
        self.model_id = model_id


class StoreNotConfigured(ApiError):
    kind = "unavailable"
    default_code = "store_not_configured"

    def __init__(self) -> None:
        super().__init__("The model store is not configured on this node.")


def _store(request: Request) -> StoreContext:
    context = api_context(request)
    get_store = getattr(context, "get_store", None)
    store = get_store() if get_store is not None else getattr(context, "store", None)
    if store is None:
        raise StoreNotConfigured()
    return store


def _canonical(store: StoreContext) -> Path:
    if store.canonical_root is None:
        raise NoStoreHere()
    return store.canonical_root


# ---------------------------------------------------------------------------------------
# Storage breakdown
# ---------------------------------------------------------------------------------------


def _summary(manifest: Manifest) -> dict[str, Any]:
    return {k: v for k, v in manifest.to_json().items() if k != "files"}


def _local_storage(store: StoreContext, in_use: frozenset[str]) -> dict[str, Any]:
    staged = scan_staged(store.staging_root)
    canonical = registered(store.canonical_root) if store.canonical_root is not None else []
    canonical_bytes = sum(sum(m.files.values()) for m in canonical)
    probe = store.canonical_root if store.canonical_root is not None else store.staging_root
    total = store.total_bytes(probe) if store.total_bytes else None
    return {
        "isStoreHost": store.canonical_root is not None,
        "canonicalBytes": canonical_bytes if store.canonical_root is not None else None,
        "stagedBytes": sum(e.logical_bytes for e in staged),
        "stagedOwnBytes": sum(e.own_bytes for e in staged),
        "partialBytes": partial_bytes(store.staging_root) if store.staging_root.is_dir() else 0,
        "freeBytes": store.free_bytes(store.staging_root),
        "totalBytes": total,
        "reserveBytes": store.policy.reserve_bytes,
        "keepRecentBytes": store.policy.keep_recent_bytes,
        "cleanupOnDeactivate": store.policy.cleanup_on_deactivate,
        "canonical": [_summary(manifest_from_marker(m)) for m in canonical],
        "staged": [
            {"modelId": e.model_id, "revision": e.revision, "dirName": e.dir_name, "sizeBytes": e.logical_bytes,
             "ownBytes": e.own_bytes, "lastUsed": e.last_used_s, "inUse": e.model_id in in_use}
            for e in staged
        ],
    }


@router.get("/store/storage")
async def storage(request: Request) -> Any:
    context = api_context(request)
    store = _store(request)
    in_use = in_use_model_ids(context.get_state(), context.node_id, companions_of(context.get_cards))
    local = await asyncio.to_thread(_local_storage, store, in_use)
    nodes = [{"nodeId": context.node_id, "nodeName": context.node_name, **local}]
    for node_id, resources in sorted(context.get_resources().items()):
        if node_id == context.node_id:
            continue
        nodes.append({
            "nodeId": node_id, "nodeName": resources.node_name, "isStoreHost": None, "canonicalBytes": None,
            "stagedBytes": None, "freeBytes": resources.disk.free_bytes, "totalBytes": resources.disk.total_bytes,
            "reserveBytes": None,
        })
    return {"nodeId": context.node_id, "nodes": nodes}


# ---------------------------------------------------------------------------------------
# Manifests and files
# ---------------------------------------------------------------------------------------


@router.get("/store/models")
async def list_store_models(request: Request) -> Any:
    root = _canonical(_store(request))
    markers = await asyncio.to_thread(registered, root)
    return {"models": [manifest_from_marker(m).to_json() for m in markers]}


@router.get("/store/models/{model_id:path}")
async def get_store_model(request: Request, model_id: str, revision: str | None = None) -> Any:
    root = _canonical(_store(request))
    marker = await asyncio.to_thread(find_registered, root, model_id, revision)
    if marker is None:
        raise StoreModelNotFound(model_id, revision)
    return manifest_from_marker(marker).to_json()


@router.get("/store/artifacts/{dir_name}/{file_path:path}")
async def get_artifact(request: Request, dir_name: str, file_path: str) -> Any:
    root = _canonical(_store(request))
    path = await asyncio.to_thread(registered_file, root, dir_name, file_path)
    if path is None:
        raise NotFound(f"The model store has no registered file {dir_name}/{file_path}.", code="store_file_not_found")
    # Starlette answers Range requests (206 + Content-Range) and streams in bounded chunks.
    return FileResponse(path, media_type="application/octet-stream")


# ---------------------------------------------------------------------------------------
# Fetching a model the store lacks
# ---------------------------------------------------------------------------------------


class FetchBody(BaseModel):
    revision: str | None = None
    card: dict[str, Any] | None = None
    """The asking node's card, used only when this node has no card of that model (or one
    pinned to another revision)."""


def _fetch_card(context: ApiContext, model_id: str, body: FetchBody | None) -> ModelCard | None:
    own = context.get_cards().get(ModelId(model_id))
    revision = body.revision if body is not None else None
    if own is not None and (body is None or own.source_revision == revision):
        return own
    if body is not None and body.card is not None:
        try:
            card = ModelCard.model_validate(body.card)
        except ValidationError:
            return None
        return card if card.model_id == model_id and card.source_revision == revision else None
    return None


def _fetcher(request: Request, store: StoreContext) -> StoreFetcher:
    fetcher = getattr(request.app.state, "store_fetcher", None)
    if fetcher is None:
        # Canonical downloads keep the node's disk reserve on the store's volume.
        fetcher = StoreFetcher(reserve_bytes=store.policy.reserve_bytes, free_bytes=store.free_bytes)
        request.app.state.store_fetcher = fetcher
    return fetcher


async def fetch_step(request: Request, model_id: str, body: FetchBody | None = None) -> FetchStatus:
    """Start (or follow) the store host's fetch of `model_id`: its status now. Raises the
    `ApiError` that explains why not (no store here, no Hugging Face card). Ollama's
    `/api/pull` polls this too."""
    context = api_context(request)
    store = _store(request)
    root = _canonical(store)
    card = _fetch_card(context, model_id, body)
    if card is None or card.source != "huggingface":
        raise NotFound(f"No Hugging Face model card for {model_id!r} at that revision on the store host.",
                       code="model_card_not_found", param="modelId")
    return await asyncio.to_thread(_fetcher(request, store).request, card, root)


@router.post("/store/models/{model_id:path}/fetch")
async def fetch_store_model(request: Request, model_id: str, body: FetchBody | None = None) -> Any:
    status = await fetch_step(request, model_id, body)
    return JSONResponse(status.to_json(), status_code=status.http_status)


# ---------------------------------------------------------------------------------------
# Deleting and purging
# ---------------------------------------------------------------------------------------


def _known_anywhere(context: ApiContext, store: StoreContext, model_id: str) -> bool:
    state = context.get_state()
    if any(isinstance(per.get(ModelId(model_id)), DownloadStatusCompleted) for per in state.downloads.values()):
        return True
    return any(e.model_id == model_id for e in scan_staged(store.staging_root))


async def delete_model(request: Request, model_id: str) -> dict[str, Any]:
    """Evict `model_id` everywhere (staged copies) and remove its canonical copy. Raises the
    `ApiError` that explains why not. Ollama's `/api/delete` does the same."""
    context = api_context(request)
    store = _store(request)
    root = _canonical(store)
    has_canonical = bool(await asyncio.to_thread(lambda: downloaded_models(root).get(model_id)))
    if not has_canonical and not await asyncio.to_thread(_known_anywhere, context, store, model_id):
        raise StoreModelNotFound(model_id)
    command = EvictStagedModel(command_id=CommandId(new_id()), model_id=ModelId(model_id))
    # Broadcast first: when no master takes it, nothing has changed yet and a retry is safe.
    try:
        await context.submit_command(command)
    except Exception as exc:
        raise ClusterNotReady(f"The eviction could not be broadcast, nothing was deleted: {exc}") from exc
    removed = await asyncio.to_thread(remove_model, root, model_id)
    return {"modelId": model_id, "commandId": command.command_id, "removedCanonical": [p.name for p in removed],
            "evicting": True}


@router.delete("/store/models/{model_id:path}")
async def delete_store_model(request: Request, model_id: str) -> Any:
    return await delete_model(request, model_id)


@router.post("/store/purge-staging")
async def purge_staging(request: Request) -> Any:
    context = api_context(request)
    store = _store(request)
    in_use = in_use_model_ids(context.get_state(), context.node_id, companions_of(context.get_cards))
    result = await asyncio.to_thread(remove_staged, store.staging_root, in_use, store.canonical_root)
    return {"nodeId": context.node_id, "removed": list(result.removed), "keptInUse": list(result.kept_in_use),
            "freedBytes": result.freed_bytes}


__all__ = ["StoreContext", "delete_model", "fetch_step", "router"]
