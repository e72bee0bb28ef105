"""OpenAI-compatible routes: `GET /v1/models`, `POST /v1/chat/completions`, and Skulk's
`POST /v1/cancel/{command_id}`.

A chat request is validated and normalised by the adapter, bound to a placed instance (404
naming the fix when there is none: chat requests never place models), given a command
stream, and submitted to the master as `GenerateText`. Its output arrives through
`ApiContext.streams` and leaves as SSE events or one `chat.completion`. Whatever ends the
request, the cluster hears about it exactly once: `TaskFinished` when the runner ended the
stream, `CancelCommand` when this side did (the client went away, a deadline passed).

These handlers hold no policy of their own: errors are typed (`skulk.api.errors`), wire
shapes belong to the adapter, bounds and deadlines to `skulk.api.streams`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from skulk.api.adapters.openai_chat import (
    ChatCompletionRequest,
    ChatStreamEncoder,
    collect_response,
    command_id_from,
    model_entry,
    model_list,
    sse_error,
    to_params,
)
from skulk.api.errors import ClusterNotReady, InvalidRequest, ModelNotFound, NotFound, StreamFailed
from skulk.api.streams import CommandStream
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.commands import CancelCommand, Command, GenerateText, TaskFinished
from skulk.shared.types.ids import new_id

logger = logging.getLogger(__name__)

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
"""Keep proxies from buffering the event stream."""

_background: set[asyncio.Task[None]] = set()
"""Commands sent after a request ended, held until sent (the loop keeps only weak refs)."""


def _context(request: Request):  # noqa: ANN202 - ApiContext (import cycle otherwise)
    return request.app.state.skulk


def _send_later(context: Any, command: Command) -> None:
    """Submit `command` without waiting. Used where the request is ending (or already
    cancelled), so an await could be cancelled before the command leaves."""

    async def send() -> None:
        try:
            await context.submit_command(command)
        except Exception as exc:  # the request is over; all that is left is to say so
            logger.warning("could not send %s for command %s: %s", command.type, _subject(command), exc)

    try:
        task = asyncio.get_running_loop().create_task(send())
    except RuntimeError:  # a response generator finalised while the loop shuts down
        logger.warning("could not send %s for command %s: no running loop", command.type, _subject(command))
        return
    _background.add(task)
    task.add_done_callback(_background.discard)


def _subject(command: Command) -> str:
    return getattr(command, "cancelled_command_id", None) or getattr(command, "finished_command_id", command.command_id)


def _cancel(context: Any, command_id: str) -> None:
    _send_later(context, CancelCommand(command_id=new_id(), cancelled_command_id=command_id))


def _finished(context: Any, command_id: str) -> None:
    _send_later(context, TaskFinished(command_id=new_id(), finished_command_id=command_id))


async def _close_on_disconnect(request: Request, context: Any, stream: CommandStream) -> None:
    """Wait for the client to go away; then close its stream and cancel the command."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            break
    if stream.close():
        logger.info("command %s: client disconnected; cancelling", stream.command_id)
        _cancel(context, stream.command_id)


async def _drive(request: Request, context: Any, stream: CommandStream) -> AsyncIterator[TokenChunk]:
    """The token chunks of `stream` until it ends, telling the cluster how it ended: TaskFinished
    after the runner's terminal, CancelCommand when this node or the client ended it."""
    watcher = asyncio.create_task(_close_on_disconnect(request, context, stream))
    try:
        async for chunk in stream:
            if not isinstance(chunk, TokenChunk):
                # Skipped; the stream now ends with the violation once what is queued is read.
                context.streams.fail(stream.command_id, "protocol_violation", f"A chat stream carried a {chunk.type}.")
                continue
            yield chunk
        _finished(context, stream.command_id)
    except StreamFailed as failure:
        if failure.origin == "runner":
            _finished(context, stream.command_id)
        elif failure.origin == "api":
            _cancel(context, stream.command_id)
        raise
    finally:
        watcher.cancel()
        if stream.close():  # left early (the response generator was closed): cancel
            _cancel(context, stream.command_id)


async def _submit(context: Any, stream: CommandStream, command: Command) -> None:
    try:
        await context.submit_command(command)
    except Exception as exc:
        stream.close()
        raise ClusterNotReady(f"The command could not reach the master: {exc}") from exc


# ---------------------------------------------------------------------------------------
# Routes
# ---------------------------------------------------------------------------------------


@router.get("/v1/models")
def list_models(request: Request) -> dict[str, Any]:
    """Models with a placed instance, each with its context limit (`context_length`)."""
    return model_list(_context(request).list_instances(), int(time.time()))


@router.get("/v1/models/{model_id:path}")
def get_model(request: Request, model_id: str) -> dict[str, Any]:
    instances = [i for i in _context(request).list_instances() if i.model_id == model_id]
    if not instances:
        raise ModelNotFound(model_id)
    return model_entry(model_id, max(i.context_token_limit for i in instances), int(time.time()))


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(request: Request, body: ChatCompletionRequest) -> StreamingResponse | dict[str, Any]:
    context = _context(request)
    params = to_params(body)
    instance = context.find_instance(params.model_id)
    if instance is None:
        raise ModelNotFound(params.model_id)
    if params.max_tokens is not None and params.max_tokens > instance.context_token_limit:
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        raise InvalidRequest(
            f"'{param}' is {params.max_tokens}, but {params.model_id} is placed with a context of "
            f"{instance.context_token_limit} tokens.",
            param=param,
        )
    if context.get_master()[0] is None:
        raise ClusterNotReady("The cluster has no master yet (election in progress); retry shortly.")

    command_id = new_id()
    stream = context.streams.open(command_id)
    await _submit(context, stream, GenerateText(command_id=command_id, params=params))
    created = int(time.time())

    if body.stream:
        encoder = ChatStreamEncoder(
            command_id=command_id, model=body.model, created=created,
            include_usage=body.include_usage, logprobs=params.logprobs,
        )
        return StreamingResponse(_sse(request, context, stream, encoder), media_type="text/event-stream",
                                 headers=SSE_HEADERS)

    async with aclosing(_drive(request, context, stream)) as output:
        chunks = [chunk async for chunk in output]
    return collect_response(chunks, command_id=command_id, model=body.model, created=created,
                            logprobs=params.logprobs)


async def _sse(request: Request, context: Any, stream: CommandStream, encoder: ChatStreamEncoder) -> AsyncIterator[str]:
    for event in encoder.start():
        yield event
    try:
        async with aclosing(_drive(request, context, stream)) as output:
            async for chunk in output:
                for event in encoder.chunk_to_sse(chunk):
                    yield event
    except StreamFailed as failure:
        logger.info("command %s ended: %s (%s)", stream.command_id, failure.error_type, failure.message)
        for event in sse_error(failure):
            yield event
        return
    for event in encoder.finish():
        yield event


@router.post("/v1/cancel/{command_id}")
async def cancel(request: Request, command_id: str) -> dict[str, Any]:
    """Cancel a running request by its command id (or its `chatcmpl-` completion id)."""
    context = _context(request)
    command_id = command_id_from(command_id)
    open_here = context.streams.is_open(command_id)
    known = open_here or any(
        getattr(task, "command_id", None) == command_id for task in context.get_state().tasks.values()
    )
    if not known:
        raise NotFound(f"No running request has the id {command_id!r}.", param="command_id", code="unknown_command")
    try:
        await context.submit_command(CancelCommand(command_id=new_id(), cancelled_command_id=command_id))
    except Exception as exc:
        raise ClusterNotReady(f"The cancellation could not reach the master: {exc}") from exc
    context.streams.cancel(command_id, "The request was cancelled by POST /v1/cancel.")
    return {"commandId": command_id, "cancelled": True, "ownedHere": open_here}
