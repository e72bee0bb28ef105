"""Ollama-compatible routes under `/ollama`: `/api/chat` and `/api/generate` (NDJSON
streaming, on by default as in Ollama), `/api/embed` and the legacy `/api/embeddings`, `/api/tags`, `/api/ps`, `/api/show`, `/api/version`,
and the `GET`/`HEAD /ollama` liveness answer "Ollama is running".

Generation takes the shared path (`skulk.api.generation`): normalised by
`skulk.api.adapters.ollama`, bound to a placed instance (404 naming the fix when there is
none), submitted as `GenerateText`, and the cluster told exactly once how it ended. Errors
under `/ollama` render as `{"error": "..."}` (`skulk.api.errors`, selected by path). The
model listings show placed models only: Skulk places models, it does not pull them here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from skulk.api.adapters.ollama import (
    CONTEXT_HEADER,
    OLLAMA_VERSION,
    OPTION_PARAMS,
    ChatRequest,
    EmbedRequest,
    Endpoint,
    GenerateRequest,
    LegacyEmbeddingsRequest,
    OllamaEncoder,
    ShowRequest,
    Timing,
    chat_params,
    clamp_context,
    collect,
    embed_params,
    embed_response,
    generate_params,
    load_response,
    ndjson,
    ndjson_error,
    ps,
    show,
    tags,
    timestamp,
)
from skulk.api.chat_middleware import observe_collected, observed, transformed
from skulk.api.context import api_context
from skulk.api.errors import InvalidRequest, ModelNotFound, StreamFailed
from skulk.api.generation import (
    SSE_HEADERS,
    drive,
    embeddings_of,
    for_placed_model,
    open_output,
    placed_model,
    start_generation,
)
from skulk.api.openapi_errors import OLLAMA_ERROR_RESPONSES
from skulk.api.streams import CommandStream
from skulk.extensions.summary import ChatWire
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.ids import ModelId
from skulk.shared.types.tasks import TextGenerationParams

logger = logging.getLogger(__name__)

PREFIX = "/ollama"

router = APIRouter(prefix=PREFIX, responses=OLLAMA_ERROR_RESPONSES)

KEEP_ALIVE_EXPIRY = "2318-01-01T00:00:00Z"
"""`expires_at` in `/api/ps`: a placed instance stays until it is deleted, so its expiry
is as far off as Ollama's own "keep forever" answer."""


@router.get("", response_class=PlainTextResponse)
@router.head("", response_class=PlainTextResponse, include_in_schema=False)
@router.get("/", response_class=PlainTextResponse, include_in_schema=False)
@router.head("/", response_class=PlainTextResponse, include_in_schema=False)
def running() -> str:
    """Liveness, as Ollama answers it (one schema entry: the other spellings are aliases)."""
    return "Ollama is running"


@router.get("/api/version")
def version() -> dict[str, str]:
    return {"version": OLLAMA_VERSION}


@router.get("/api/tags")
def list_tags(request: Request) -> dict[str, Any]:
    context = api_context(request)
    return tags(context.list_instances(), context.get_cards(), timestamp())


@router.get("/api/ps")
def list_running(request: Request) -> dict[str, Any]:
    context = api_context(request)
    return ps(context.list_instances(), context.get_cards(), KEEP_ALIVE_EXPIRY)


@router.post("/api/show")
def show_model(request: Request, body: ShowRequest) -> dict[str, Any]:
    context = api_context(request)
    model_id = body.model or body.name
    if not model_id:
        raise InvalidRequest("model is required", param="model")
    model_id = placed_model(context, model_id)
    limits = [i.context_token_limit for i in context.list_instances() if i.model_id == model_id]
    if not limits:
        raise ModelNotFound(model_id)
    return show(model_id, context.get_cards().get(ModelId(model_id)), max(limits), timestamp())


@router.post("/api/chat", response_model=None)
async def chat(request: Request, body: ChatRequest) -> StreamingResponse | JSONResponse | dict[str, Any]:
    if not body.messages:
        return _load(request, "chat", body.model)
    return await _generate(request, "chat", body.model, chat_params(body))


@router.post("/api/generate", response_model=None)
async def generate(request: Request, body: GenerateRequest) -> StreamingResponse | JSONResponse | dict[str, Any]:
    if not body.prompt and not body.raw and not body.images:
        return _load(request, "generate", body.model)
    return await _generate(request, "generate", body.model, generate_params(body))


@router.post("/api/embed")
async def embed(request: Request, body: EmbedRequest) -> dict[str, Any]:
    started_ns = time.monotonic_ns()
    context = api_context(request)
    params = for_placed_model(context, embed_params(body.model, body.input, body.dimensions))
    vectors, usage = await embeddings_of(request, context, params)
    ended_ns = time.monotonic_ns()
    return embed_response(body.model, vectors, usage, Timing(started_ns, ended_ns, ended_ns))


@router.post("/api/embeddings")
async def embeddings(request: Request, body: LegacyEmbeddingsRequest) -> dict[str, Any]:
    """The legacy single-prompt form: `{"embedding": [...]}`."""
    context = api_context(request)
    vectors, _ = await embeddings_of(request, context, for_placed_model(context, embed_params(body.model, body.prompt)))
    return {"embedding": vectors[0]}


def _load(request: Request, endpoint: Endpoint, model: str) -> dict[str, Any]:
    context = api_context(request)
    if context.find_instance(placed_model(context, model)) is None:
        raise ModelNotFound(model)
    return load_response(endpoint, model)


async def _generate(
    request: Request, endpoint: Endpoint, model: str, params: TextGenerationParams
) -> StreamingResponse | JSONResponse | dict[str, Any]:
    context = api_context(request)
    started_ns = time.monotonic_ns()
    params = params.model_copy(update={"model_id": placed_model(context, model)})
    instance = context.find_instance(params.model_id)
    clamped = None
    if instance is not None:
        params, clamped = clamp_context(params, instance.context_token_limit)
    headers = {CONTEXT_HEADER: str(clamped)} if clamped is not None else {}
    wire: ChatWire = "ollama.chat" if endpoint == "chat" else "ollama.generate"
    params = await transformed(context, params)
    stream = await start_generation(context, params, max_tokens_param="options.num_predict", param_names=OPTION_PARAMS)
    encoder = OllamaEncoder(endpoint=endpoint, model=model)
    if params.stream:
        output = observed(context, await open_output(request, context, stream, params), wire=wire,
                          request_id=stream.command_id, model_id=params.model_id)
        return StreamingResponse(_lines(stream, encoder, started_ns, output),
                                 media_type="application/x-ndjson", headers={**SSE_HEADERS, **headers})
    first_token_ns: int | None = None
    chunks = []
    async with aclosing(drive(request, context, stream, params)) as output:
        async for chunk in output:
            first_token_ns = first_token_ns or time.monotonic_ns()
            chunks.append(chunk)
    observe_collected(context, chunks, wire=wire, request_id=stream.command_id, model_id=params.model_id)
    body = collect(encoder, chunks, Timing(started_ns, first_token_ns, time.monotonic_ns()))
    return JSONResponse(body, headers=headers) if headers else body


async def _lines(
    stream: CommandStream, encoder: OllamaEncoder, started_ns: int, chunks: AsyncGenerator[TokenChunk, None],
) -> AsyncIterator[str]:
    first_token_ns: int | None = None
    try:
        async with aclosing(chunks) as output:
            async for chunk in output:
                first_token_ns = first_token_ns or time.monotonic_ns()
                line = encoder.line(chunk)
                if line is not None:
                    yield line
    except StreamFailed as failure:
        logger.info("command %s ended: %s (%s)", stream.command_id, failure.error_type, failure.message)
        yield ndjson_error(failure)
        return
    yield ndjson(encoder.final(Timing(started_ns, first_token_ns, time.monotonic_ns())))
