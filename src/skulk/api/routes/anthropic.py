"""Anthropic-compatible routes: `POST /v1/messages`, stream and not, and
`POST /v1/messages/count_tokens`.

The request is normalised by `skulk.api.adapters.anthropic` and then takes the shared
generation path (`skulk.api.generation`): bound to a placed instance (404 naming the fix
when there is none), submitted as `GenerateText`, its output serialised as Anthropic SSE
events or one `message`, and the cluster told exactly once how it ended. Errors on this
path render in Anthropic's shape (`skulk.api.errors`, selected by path). No policy here.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from skulk.api.adapters.anthropic import (
    PARAM_NAMES,
    CountTokensRequest,
    MessagesRequest,
    MessageStreamEncoder,
    collect_message,
    count_params,
    image_urls,
    sse_error,
    to_params,
)
from skulk.api.context import api_context
from skulk.api.generation import (
    fetched_images,
    for_placed_model,
)
from skulk.api.generation_handle import Generation
from skulk.api.openapi_errors import ANTHROPIC_ERROR_RESPONSES

router = APIRouter(responses=ANTHROPIC_ERROR_RESPONSES)


@router.post("/v1/messages", response_model=None)
async def create_message(request: Request, body: MessagesRequest) -> StreamingResponse | dict[str, Any]:
    context = api_context(request)
    params = for_placed_model(context, to_params(body, await fetched_images(context, body.model, image_urls(body))))
    generation = await Generation.start(request, context, params, param_names=PARAM_NAMES, wire="anthropic.messages")
    if body.stream:
        encoder = MessageStreamEncoder(command_id=generation.command_id, model=body.model, stop_sequences=params.stop)
        return await generation.stream(lambda _: encoder, sse_error)
    [chunks] = await generation.collect()
    return collect_message(chunks, command_id=generation.command_id, model=body.model, stop_sequences=params.stop)


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request, body: CountTokensRequest) -> dict[str, int]:
    """The input tokens the same message request would use: the runner renders and
    tokenizes it exactly as for generation, and generates nothing."""
    context = api_context(request)
    fetched = await fetched_images(context, body.model, image_urls(body))
    generation = await Generation.start(request, context, for_placed_model(context, count_params(body, fetched)),
                                        param_names=PARAM_NAMES)
    [chunks] = await generation.collect()
    usage = [chunk.usage for chunk in chunks if chunk.usage is not None]
    return {"input_tokens": usage[-1].prompt_tokens if usage else 0}
