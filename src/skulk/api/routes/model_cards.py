"""Model discovery and custom cards: search the hub, add a card from a repo or a local path,
delete a custom card.

- `GET /models/search?q=` (also `query=`): Hugging Face search, plus a bounded fallback for
  GGUF file names, which the hub's search does not index: broaden the name's prefix
  (`card_builder.broadening_prefixes`), read at most `MAX_INSPECTED_REPOS` listings, keep
  repos holding that exact file, and return the matched path (`matchedFile`) with each.
- `POST /models/add` `{"modelId": "owner/repo", "ggufFile"?, "onnxFile"?, "revision"?}` builds a
  card from the repo's metadata (`modelId` may also be `owner/repo:QUANT`, `hf.co/owner/repo:QUANT` or
  an Ollama library name such as `llama3.2:1b`: `skulk.models.model_names`) (config.json -> MLX card; a GGUF repo -> llama.cpp card pinned to one
  quant file; a CTranslate2 Whisper -> a faster-whisper Transcription card; a Piper voice
  repo -> a Piper SpeechSynthesis card for `onnxFile` or its only voice: `skulk.models.speech_cards`), `{"path": "/abs/file.gguf" | "/abs/mlx-dir", "modelId"?: "local/..."}` from a
  local model; either way it submits AddCustomModelCard and answers with the card's modelId.
- `DELETE /models/custom/{modelId}` submits DeleteCustomModelCard for a custom card.

Hub and disk reads run in threads under a deadline; every failure is a typed ApiError
rendered by `api.errors` (404 unknown repo, 400 unusable repo or a hub refusal naming
HF_TOKEN, 502 hub unreachable, 503 no cluster to take the card). The master decides the
commands (`master.commands`); this module never writes card files itself.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path, PurePosixPath
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from skulk.api.context import api_context
from skulk.api.errors import ApiError, ClusterNotReady, Conflict, InvalidRequest, NotFound
from skulk.api.local_paths import allowed_local_path
from skulk.models import hub_meta
from skulk.models.card_builder import (
    MAX_INSPECTED_REPOS,
    CardBuildError,
    broadening_prefixes,
    card_from_config,
    card_from_gguf,
    is_filename_query,
    local_model_id,
    match_basename,
)
from skulk.models.downloads import HubSource
from skulk.models.hub_cards import card_from_hub, read_gguf_header
from skulk.models.hub_files import (
    CONFIG_FILE,
    RepoFile,
    SelectionError,
    is_gguf,
    select_safetensors,
    shard_group,
    shard_info,
    total_size_bytes,
)
from skulk.models.model_names import UnknownModelName, load_library, resolve_model_name
from skulk.models.safetensors_header import model_parameter_elements
from skulk.models.template_files import chat_template
from skulk.shared.types.cards import LOCAL_MODEL_PREFIX, ModelCard
from skulk.shared.types.commands import AddCustomModelCard, DeleteCustomModelCard
from skulk.shared.types.ids import CommandId, ModelId, new_id

router = APIRouter()

SEARCH_DEADLINE_S = 30.0
"""A whole search, fallback included; past it the caller gets a 504 instead of waiting."""
ADD_DEADLINE_S = 60.0
"""Reading a repo's metadata (listing, config or GGUF header) to build a card."""
APPLY_WAIT_S = 10.0
"""How long `POST /models/add` waits to see the master apply the new card before answering
(`applied: false` after it: the master may still take it, or the call can be repeated)."""
RESUBMIT_INTERVAL_S = 1.0
"""Pause between sends of the same card while it has not shown up in State."""
APPLY_POLL_S = 0.05


class HubUnavailable(ApiError):
    """The hub could not be reached or failed on its side (network, 5xx)."""

    kind = "upstream"
    default_code = "hub_unavailable"


class Timeout(ApiError):
    kind = "timeout"
    default_code = "hub_timeout"


def _from_hub_error(exc: hub_meta.HubError) -> ApiError:
    if exc.kind == "not_found":
        return NotFound(str(exc), code="hub_not_found")
    if exc.kind == "unauthorized":
        return InvalidRequest(f"{exc} (the node's HF_TOKEN is what the hub sees)", code="hub_unauthorized")
    return HubUnavailable(str(exc))


async def _off_loop(fn, deadline_s: float):
    try:
        return await asyncio.wait_for(asyncio.to_thread(fn), deadline_s)
    except TimeoutError:
        raise Timeout(f"the hub did not answer within {deadline_s:.0f} s") from None
    except hub_meta.HubError as exc:
        raise _from_hub_error(exc) from exc
    except (CardBuildError, SelectionError) as exc:
        raise InvalidRequest(str(exc), code="unusable_model") from exc


# ---------------------------------------------------------------------------------------
# Search
# ---------------------------------------------------------------------------------------


def _hit_json(hit: hub_meta.SearchHit, matched_file: str | None = None) -> dict[str, Any]:
    return {
        "modelId": hit.repo_id,
        "format": "gguf" if "gguf" in hit.tags else ("safetensors" if "safetensors" in hit.tags else None),
        "tags": list(hit.tags),
        "downloads": hit.downloads,
        "likes": hit.likes,
        "matchedFile": matched_file,
    }


def _filename_fallback(query: str, hub: HubSource) -> list[dict[str, Any]]:
    inspected: set[str] = set()
    results: list[dict[str, Any]] = []
    for prefix in broadening_prefixes(query):
        for hit in hub_meta.search(prefix, hub):
            if hit.repo_id in inspected or len(inspected) >= MAX_INSPECTED_REPOS:
                continue
            inspected.add(hit.repo_id)
            try:
                listing = hub_meta.repo_listing(hit.repo_id, hub)
            except hub_meta.HubError:
                continue  # a private or vanished candidate is simply not a match
            matched = match_basename(listing.files, query)
            if matched is not None:
                results.append(_hit_json(hit, matched))
        if results or len(inspected) >= MAX_INSPECTED_REPOS:
            break
    return results


def _search(query: str, limit: int, hub: HubSource) -> dict[str, Any]:
    results = [_hit_json(hit) for hit in hub_meta.search(query, hub, limit)]
    fallback = False
    if not results and is_filename_query(query):
        results, fallback = _filename_fallback(query, hub)[:limit], True
    return {"query": query, "results": results, "filenameFallback": fallback}


@router.get("/models/search")
async def search_models(request: Request, q: str | None = None, query: str | None = None, limit: int = 20) -> Any:
    text = (q if q is not None else query or "").strip()
    if not text:
        raise InvalidRequest("Give a search term: GET /models/search?q=llama", param="q", code="missing_required_parameter")
    if not 1 <= limit <= hub_meta.SEARCH_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {hub_meta.SEARCH_LIMIT}", param="limit")
    hub = HubSource.from_env()
    return await _off_loop(lambda: _search(text, limit, hub), SEARCH_DEADLINE_S)


# ---------------------------------------------------------------------------------------
# Add
# ---------------------------------------------------------------------------------------


class AddModelBody(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)
    model_id: str | None = None
    path: str | None = None
    gguf_file: str | None = None
    onnx_file: str | None = None
    """A Piper voice repo's voice (`<name>.onnx`, its `.onnx.json` beside it)."""
    revision: str | None = None
    name: str | None = None
    override: bool = False
    """Replace a card that already has this id (built-in or custom); without it that is a 409."""


def _card_from_hub(body: AddModelBody, hub: HubSource, card_ids: frozenset[str]) -> ModelCard:
    """The card for a repo id, `owner/repo:QUANT`, `hf.co/owner/repo:QUANT` or an Ollama
    library name (`skulk.models.model_names`)."""
    try:
        resolved = resolve_model_name(body.model_id or "", card_ids, load_library())
    except UnknownModelName as exc:
        raise NotFound(str(exc), code="unknown_model_name", param="modelId") from None
    return card_from_hub(resolved.model_id, hub, revision=body.revision, gguf_file=body.gguf_file,
                         quant=resolved.quant, name=body.name, onnx_file=body.onnx_file)


def _local_files(directory: Path) -> list[RepoFile]:
    return [RepoFile(p.name, p.stat().st_size) for p in sorted(directory.iterdir()) if p.is_file()]


def _read_file_prefix(path: Path):
    def read(size: int) -> bytes:
        with path.open("rb") as handle:
            return handle.read(size)

    return read


def _text_file_reader(directory: Path):
    """A reader of a model folder's small text files (None: no such file)."""

    def read(name: str) -> str | None:
        file = directory / name
        if not file.is_file():
            return None
        with file.open("rb") as handle:
            return handle.read(hub_meta.CONFIG_LIMIT_BYTES).decode("utf-8", errors="replace")

    return read


def _card_from_path(body: AddModelBody, roots: tuple[Path, ...]) -> ModelCard:
    path = allowed_local_path(body.path or "", roots)
    if not path.exists():
        raise NotFound(f"{path} does not exist on this node", code="path_not_found")
    if body.model_id is not None and not body.model_id.startswith(LOCAL_MODEL_PREFIX):
        raise InvalidRequest(f"a local model's id starts with {LOCAL_MODEL_PREFIX!r}", param="modelId")
    if path.is_file():
        if not is_gguf(path.name):
            raise InvalidRequest("a model file must be a .gguf file (or give an MLX directory)", param="path")
        info = shard_info(path.name)
        stem = info[0] if info else path.name[: -len(".gguf")]
        model_id = body.model_id or local_model_id(stem)
        group = shard_group(model_id, _local_files(path.parent), path.name)
        header = read_gguf_header(_read_file_prefix(path), str(path))
        return card_from_gguf(model_id, header.meta, path.name, total_size_bytes(_local_files(path.parent), group),
                              local_path=str(path.parent), name=body.name, tensor_elements=header.tensor_elements)
    files = _local_files(path)
    model_id = body.model_id or local_model_id(path.name)
    if (path / CONFIG_FILE).is_file() and any(f.path.endswith(".safetensors") for f in files):
        selected = select_safetensors(model_id, files)
        try:
            config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CardBuildError(str(path), f"unreadable {CONFIG_FILE}: {exc}") from None
        weights = [name for name in selected if name.endswith(".safetensors")]
        return card_from_config(model_id, config, total_size_bytes(files, selected), local_path=str(path),
                                name=body.name, chat_template=chat_template(_text_file_reader(path)),
                                tensor_elements=model_parameter_elements(
                                    weights, lambda name: _read_file_prefix(path / name), config))
    raise InvalidRequest(f"{path} is a directory but not an MLX model folder (config.json with *.safetensors); "
                         "for a GGUF model give the path of the .gguf file itself", param="path")


async def _submit(request: Request, command) -> None:
    try:
        await api_context(request).submit_command(command)
    except Exception as exc:
        raise ClusterNotReady(f"the card could not reach the master: {exc}") from exc


@router.post("/models/add")
async def add_model(request: Request, body: AddModelBody) -> Any:
    if body.model_id is None and body.path is None:
        raise InvalidRequest('Give "modelId" (a Hugging Face repo) or "path" (a local model)', param="modelId")
    if body.path is None:
        if (body.model_id or "").startswith(LOCAL_MODEL_PREFIX):
            raise InvalidRequest(f"{body.model_id!r} is a local id: give \"path\" to add a local model", param="modelId")
        if body.gguf_file is not None and (PurePosixPath(body.gguf_file).is_absolute() or not is_gguf(body.gguf_file)):
            raise InvalidRequest("ggufFile must be a repo-relative path ending in .gguf", param="ggufFile")
        if body.onnx_file is not None and (PurePosixPath(body.onnx_file).is_absolute()
                                           or not body.onnx_file.endswith(".onnx") or ".." in body.onnx_file.split("/")):
            raise InvalidRequest("onnxFile must be a repo-relative path ending in .onnx", param="onnxFile")
        if body.onnx_file is not None and body.gguf_file is not None:
            raise InvalidRequest("give ggufFile or onnxFile, not both", param="onnxFile")
        card = await build_hub_card(request, body)
    else:
        roots = api_context(request).local_model_dirs
        card = await _off_loop(lambda: _card_from_path(body, roots), ADD_DEADLINE_S)
    applied = await register_card(request, card, override=body.override)
    return {"modelId": card.model_id, "applied": applied, "card": card.to_wire()}


async def build_hub_card(request: Request, body: AddModelBody) -> ModelCard:
    """The card a hub repo or a typed name (`model_names`) stands for, read from the hub
    under ADD_DEADLINE_S; typed errors (404 unknown name or repo, 400 unusable, 502 hub)."""
    hub = HubSource.from_env()
    card_ids = frozenset(api_context(request).get_cards())
    return await _off_loop(lambda: _card_from_hub(body, hub, card_ids), ADD_DEADLINE_S)


async def register_card(request: Request, card: ModelCard, *, override: bool = False) -> bool:
    """Submit `card` as a custom card and wait up to APPLY_WAIT_S to see it applied; whether
    it was. A different card with the same id is a 409 unless `override`."""
    context = api_context(request)
    existing = context.get_cards().get(card.model_id)
    if existing is not None and existing != card and not override:
        raise Conflict(f"A card with the id {card.model_id!r} exists already; give another modelId, or send "
                       '"override": true to replace it for the whole cluster.', param="modelId", code="card_exists")
    deadline = time.monotonic() + APPLY_WAIT_S
    next_submit = 0.0
    while context.get_cards().get(card.model_id) != card and time.monotonic() < deadline:
        # Commands are not queued for a master that is still being elected: send again until
        # the card shows up (the master records an unchanged card only once).
        if time.monotonic() >= next_submit:
            await _submit(request, AddCustomModelCard(command_id=CommandId(new_id()), card=card))
            next_submit = time.monotonic() + RESUBMIT_INTERVAL_S
        await asyncio.sleep(APPLY_POLL_S)
    return context.get_cards().get(card.model_id) == card


# ---------------------------------------------------------------------------------------
# Delete
# ---------------------------------------------------------------------------------------


@router.delete("/models/custom/{model_id:path}")
async def delete_custom_model(request: Request, model_id: str) -> Any:
    state = api_context(request).get_state()
    if model_id not in state.custom_cards:
        raise NotFound(f"no custom card {model_id}; built-in cards cannot be deleted", code="unknown_card")
    await _submit(request, DeleteCustomModelCard(command_id=CommandId(new_id()), model_id=ModelId(model_id)))
    return {"modelId": model_id, "deleting": True}
