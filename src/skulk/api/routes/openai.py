"""OpenAI-compatible routes: `GET /v1/models`, `POST /v1/chat/completions`,
`POST /v1/completions` (legacy), `POST /v1/responses`, `POST /v1/embeddings`, and Skulk's
`POST /v1/cancel/{command_id}` (which takes a command id or any of the response ids).

A chat request is validated and normalised by the adapter, bound to a placed instance (404
naming the fix when there is none: chat requests never place models), given a command
stream, and submitted to the master as `GenerateText`. Its output arrives through
`ApiContext.streams` and leaves as SSE events or one `chat.completion`. Whatever ends the
request, the cluster hears about it exactly once: `TaskFinished` when the runner ended the
stream, `CancelCommand` when this side did (the client went away, a deadline passed).

The shared flow lives in `skulk.api.generation`. These handlers hold no policy of their own: errors are typed (`skulk.api.errors`), wire
shapes belong to the adapter, bounds and deadlines to `skulk.api.streams`.
"""

from __future__ import annotations

import logging
import time
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.requests import HTTPConnection

from skulk.api.adapters import openai_completions, openai_embeddings, openai_responses
from skulk.api.adapters.openai_chat import (
    ChatCompletionRequest,
    ChatStreamEncoder,
    choice_count,
    collect_response,
    command_id_from,
    image_urls,
    merge_choices,
    model_entry,
    model_list,
    served_by,
    sse_error,
    to_params,
)
from skulk.api.auth import current_principal, presented_keys
from skulk.api.context import api_context
from skulk.api.errors import ClusterNotReady, InvalidRequest, ModelNotFound, NotFound
from skulk.api.generation import (
    embeddings_of,
    fetched_images,
    for_placed_model,
)
from skulk.api.generation_handle import Generation
from skulk.api.openapi_errors import OPENAI_ERROR_RESPONSES
from skulk.api.response_store import RESPONSE_TTL_S, ResponseStore, StoredResponse, key_scope
from skulk.observe.cluster_diagnostics import gather_from_peers
from skulk.shared.types.commands import CancelCommand
from skulk.shared.types.common import ChatMessage
from skulk.shared.types.ids import CommandId, new_id

logger = logging.getLogger(__name__)

router = APIRouter(responses=OPENAI_ERROR_RESPONSES)


_context = api_context


# ---------------------------------------------------------------------------------------
# Routes
# ---------------------------------------------------------------------------------------


@router.get("/v1/models")
def list_models(request: Request) -> dict[str, Any]:
    """Models with a placed instance, each with its context limit (`context_length`)."""
    return model_list(_context(request).list_instances(), int(time.time()))


@router.get("/v1/models/{model_id:path}")
def get_model(request: Request, model_id: str) -> dict[str, Any]:
    best = served_by(_context(request).list_instances(), model_id)
    if best is None:
        raise ModelNotFound(model_id)
    return model_entry(model_id, best.context_token_limit, int(time.time()), best.capacity)


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request, body: ChatCompletionRequest) -> StreamingResponse | dict[str, Any]:
    context = _context(request)
    fetched = await fetched_images(context, body.model, image_urls(body))
    params = for_placed_model(context, to_params(body, fetched))
    n = choice_count(body.n)
    generation = await Generation.start(
        request, context, params, n,
        max_tokens_param="max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens",
        wire="openai.chat")
    created = int(time.time())
    if body.stream:
        # One response id for the request (the first choice's), every chunk with its index.
        return await generation.stream(lambda i: ChatStreamEncoder(
            command_id=generation.command_id, model=body.model, created=created, include_usage=body.include_usage,
            logprobs=params.logprobs, index=i, one_of_several=generation.several), sse_error)
    bodies = [collect_response(chunks, command_id=generation.command_id, model=body.model, created=created,
                               logprobs=params.logprobs) for chunks in await generation.collect()]
    return merge_choices(bodies) if generation.several else bodies[0]


@router.post("/v1/completions", response_model=None)
async def completions(
    request: Request, body: openai_completions.CompletionRequest
) -> StreamingResponse | dict[str, Any]:
    """Legacy text completions: the prompt is sent raw (no chat template)."""
    context = _context(request)
    prompts = openai_completions.prompts(body)
    every = [for_placed_model(context, openai_completions.to_params(body, prompt)) for prompt in prompts]
    params = every[0]
    n = choice_count(body.n)
    generation = await Generation.start(request, context, every, n)
    created = int(time.time())
    echoes = [prompt if body.echo else None for prompt in prompts for _ in range(n)]
    if body.stream:
        return await generation.stream(lambda i: openai_completions.CompletionStreamEncoder(
            command_id=generation.command_id, model=body.model, created=created, logprobs=params.logprobs,
            echo=echoes[i], index=i, one_of_several=generation.several, prompts=len(prompts)), sse_error)
    bodies = [openai_completions.collect_completion(chunks, command_id=generation.command_id, model=body.model,
                                                    created=created, logprobs=params.logprobs, echo=echo)
              for chunks, echo in zip(await generation.collect(), echoes, strict=True)]
    return merge_choices(bodies, prompts=len(prompts)) if generation.several else bodies[0]


def kept_responses(request: HTTPConnection) -> ResponseStore:
    store = getattr(request.app.state, "response_store", None)
    if store is None:
        store = request.app.state.response_store = ResponseStore()
    return store


def caller_scope(request: HTTPConnection) -> str:
    return key_scope(next(iter(presented_keys(request.headers)), None))


RESPONSES_PARAMS = {"response_format": "text.format", "thinking": "reasoning.effort",
                    "reasoning_effort": "reasoning.effort"}
"""Internal parameter names -> the Responses API's, for errors about them."""

KEY_SCOPE_HEADER = "X-Skulk-Key-Scope"
"""What a node asking a peer for a stored response sends: the caller's key scope (a digest
of its API key, `key_scope`), so the peer answers only what that key stored."""


def _conversation_path(response_id: str) -> str:
    return f"/v1/responses/{quote(response_id, safe='')}/conversation"


async def stored_response(request: HTTPConnection, response_id: str, param: str = "response_id") -> StoredResponse:
    """The stored response `response_id` of this caller's key: kept here, or by the peer
    that answered it (asked all at once, each within the peer deadline)."""
    scope = caller_scope(request)
    found = kept_responses(request).get(response_id, scope, time.monotonic())
    if found is not None:
        return found
    context = _context(request)
    answers = await gather_from_peers(context.get_peer_urls(), _conversation_path(response_id),
                                      api_key=context.peer_credential, headers={KEY_SCOPE_HEADER: scope})
    for answer in answers.values():
        if isinstance(answer.body, dict) and isinstance(answer.body.get("response"), dict):
            return StoredResponse(scope, time.monotonic(), answer.body["response"], tuple(
                ChatMessage.model_validate(m) for m in answer.body.get("conversation") or ()))
    unreachable = sorted(node for node, answer in answers.items() if answer.body is None and answer.status != 404)
    raise NotFound(f"No stored response {response_id!r} for this API key in this cluster (responses are kept "
                   f"{RESPONSE_TTL_S / 3600:g} h by the node that answered them"
                   f"{'; unreachable now: ' + ', '.join(unreachable) if unreachable else ''}).", param=param,
                   code="response_not_found")


@router.get("/v1/responses/{response_id}/conversation", include_in_schema=False)
async def peer_stored_response(request: Request, response_id: str) -> dict[str, Any]:
    """A peer asking for a response this node stored (for the key scope it names), with
    the conversation a continuation needs. Peers only: other callers get a 404."""
    if current_principal().id not in ("peer", "anonymous-unchecked"):
        raise NotFound("Not found.", code="not_found")
    scope = request.headers.get(KEY_SCOPE_HEADER, "")
    found = kept_responses(request).get(response_id, scope, time.monotonic())
    if found is None:
        raise NotFound(f"No stored response {response_id!r} for this key scope on this node.",
                       param="response_id", code="response_not_found")
    return {"response": found.body, "conversation": [m.model_dump(mode="json") for m in found.conversation]}


@router.post("/v1/responses", response_model=None)
async def responses(request: Request, body: openai_responses.ResponsesRequest) -> StreamingResponse | dict[str, Any]:
    """The Responses API, with function tools and stored responses (`store`,
    `previous_response_id`; see `skulk.api.response_store`)."""
    context = _context(request)
    history = (await stored_response(request, body.previous_response_id, "previous_response_id")).conversation \
        if body.previous_response_id else ()
    fetched = await fetched_images(context, body.model, openai_responses.image_urls(body), "input")
    params = for_placed_model(context, openai_responses.to_params(body, history, fetched))
    generation = await Generation.start(request, context, params, max_tokens_param="max_output_tokens",
                                        param_names=RESPONSES_PARAMS, wire="openai.responses")
    created = int(time.time())
    scope = caller_scope(request)

    def keep(response: dict[str, Any]) -> None:
        if body.store is not False and response["status"] in ("completed", "incomplete"):
            kept_responses(request).put(response["id"], StoredResponse(
                scope, time.monotonic(), response, openai_responses.conversation_of(params, body, response)))

    if body.stream:
        encoder = openai_responses.ResponseStreamEncoder(command_id=generation.command_id, request=body,
                                                         created=created, on_done=keep, clock=lambda: int(time.time()))
        return await generation.stream(lambda _: encoder, encoder.error_events)
    [chunks] = await generation.collect()
    response = openai_responses.collect_response(chunks, command_id=generation.command_id, request=body,
                                                 created=created, completed_at=int(time.time()))
    keep(response)
    return response


@router.post("/v1/responses/compact")
async def compact_response(request: Request, body: openai_responses.CompactRequest) -> dict[str, Any]:
    """Compaction: the conversation (`previous_response_id`, stored by any node, and/or
    `input`) folded into its user messages and one compaction item holding a summary the
    model writes. Sending those items as a later request's input continues from the summary."""
    context = _context(request)
    history = (await stored_response(request, body.previous_response_id, "previous_response_id")).conversation \
        if body.previous_response_id else ()
    params = for_placed_model(context, openai_responses.compaction_params(body, history))
    placed = context.find_instance(params.model_id)
    if placed is not None:  # a summary is bounded: the compacted conversation must fit again
        params = params.model_copy(update={
            "max_tokens": openai_responses.compaction_max_tokens(placed.context_token_limit)})
    generation = await Generation.start(request, context, params, max_tokens_param="input")
    created = int(time.time())
    [chunks] = await generation.collect()
    return openai_responses.compacted(params, chunks, command_id=generation.command_id, created=created)


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> dict[str, Any]:
    """A stored response, for the API key that created it (whichever node stored it)."""
    return (await stored_response(request, response_id)).body


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
    if not kept_responses(request).delete(response_id, caller_scope(request)):
        await stored_response(request, response_id)  # 404 unless a peer holds it
        raise InvalidRequest(f"Stored response {response_id!r} is kept by another node of the cluster: delete it "
                             "through the node that answered it (any node can read it).", param="response_id",
                             code="stored_on_another_node")
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@router.post("/v1/embeddings")
async def embeddings(request: Request, body: openai_embeddings.EmbeddingRequest) -> dict[str, Any]:
    """Embeddings from a placed model's engine, answered once all inputs are done."""
    context = _context(request)
    params = for_placed_model(context, openai_embeddings.to_params(body))
    vectors, usage = await embeddings_of(request, context, params)
    return openai_embeddings.embedding_response(vectors, usage, model=body.model,
                                                encoding_format=body.encoding_format)


@router.post("/v1/cancel/{command_id}")
async def cancel(request: Request, command_id: str) -> dict[str, Any]:
    """Cancel a running request by its command id (or its `chatcmpl-` completion id).

    Only whoever made the request may cancel it: the same key, or the same loopback client
    (`skulk.api.access`); anyone else gets the same 404 as for an unknown id, so ids read
    elsewhere reveal nothing. An operator key (or a cluster peer) may cancel any request
    in the cluster, also one held by another node's API."""
    context = _context(request)
    command_id = command_id_from(command_id)
    for prefix in (openai_completions.COMPLETION_ID_PREFIX, openai_responses.RESPONSE_ID_PREFIX):
        command_id = command_id.removeprefix(prefix)
    caller = current_principal()
    owner = context.streams.requested_by(command_id)
    open_here = owner is not None and owner == caller.id
    known = open_here or (caller.cancels_any and any(
        getattr(task, "command_id", None) == command_id for task in context.get_state().tasks.values()))
    if not known:
        raise NotFound(f"No running request of yours has the id {command_id!r}.", param="command_id",
                       code="unknown_command")
    try:
        await context.submit_command(CancelCommand(command_id=CommandId(new_id()), cancelled_command_id=CommandId(command_id)))
    except Exception as exc:
        raise ClusterNotReady(f"The cancellation could not reach the master: {exc}") from exc
    context.streams.cancel(command_id, "The request was cancelled by POST /v1/cancel.")
    return {"commandId": command_id, "cancelled": True, "ownedHere": open_here}
