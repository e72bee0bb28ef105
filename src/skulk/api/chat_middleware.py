"""Where chat requests meet the node's extensions (`skulk.extensions.middleware`): the
transform after a route's adapter and before dispatch, the observer tap on the way out, and
the in-process embeddings an extension's context asks for.

Every chat route calls `transformed` on its adapter's params (through `Generation.start`
or directly) and taps its output with `observed`; with no extension loaded both return
their input untouched. A "fail"-policy refusal leaves here as `ExtensionFailed`, rendered in
the caller's wire format like every other error. This module holds no policy of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

from skulk.api.context import ApiContext
from skulk.api.errors import ExtensionFailed, StreamFailed
from skulk.api.generation import embeddings_of, for_placed_model
from skulk.extensions.middleware import ExtensionRefused, ExtensionRuntime
from skulk.extensions.summary import ChatWire, summarise
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.ids import ModelId
from skulk.shared.types.tasks import TextGenerationParams
from skulk.shared.types.workload_io import EmbeddingParams


async def transformed(context: ApiContext, params: TextGenerationParams) -> TextGenerationParams:
    """`params` through the node's chat transforms (unchanged when none is loaded)."""
    runtime = context.extensions
    if runtime is None or not runtime.transforms:
        return params
    try:
        return await runtime.transform_chat_request(params)
    except ExtensionRefused as refused:
        raise ExtensionFailed(refused.extension, refused.reason) from refused


def observes(context: ApiContext) -> bool:
    return context.extensions is not None and context.extensions.observes


def observe_collected(
    context: ApiContext,
    chunks: Sequence[TokenChunk],
    *,
    wire: ChatWire,
    request_id: str,
    model_id: str,
    choice_index: int = 0,
) -> None:
    """Hand a collected (non-streamed) response's summary to the observers."""
    if context.extensions is not None and context.extensions.observes:
        context.extensions.observe_chat_response(
            summarise(chunks, request_id=request_id, model_id=model_id, wire=wire, choice_index=choice_index)
        )


def observed(
    context: ApiContext,
    output: AsyncGenerator[TokenChunk, None],
    *,
    wire: ChatWire,
    request_id: str,
    model_id: str,
    choice_index: int = 0,
) -> AsyncGenerator[TokenChunk, None]:
    """`output` itself when no extension observes; else `output` passed through unchanged,
    its summary handed to the observers once it ends (completed, failed, or closed when the
    client left), exactly once."""
    runtime = context.extensions
    if runtime is None or not runtime.observes:
        return output
    return _tapped(runtime, output, wire=wire, request_id=request_id, model_id=model_id, choice_index=choice_index)


async def _tapped(
    runtime: ExtensionRuntime,
    output: AsyncGenerator[TokenChunk, None],
    *,
    wire: ChatWire,
    request_id: str,
    model_id: str,
    choice_index: int,
) -> AsyncGenerator[TokenChunk, None]:
    seen: list[TokenChunk] = []
    error: str | None = "the response was closed before it ended"
    try:
        async for chunk in output:
            seen.append(chunk)
            yield chunk
        error = None
    except StreamFailed as failure:
        error = f"{failure.error_type}: {failure.message}"
        raise
    finally:
        await output.aclose()  # closing the tap closes the output: the client left, cancel
        runtime.observe_chat_response(
            summarise(seen, request_id=request_id, model_id=model_id, wire=wire, choice_index=choice_index, error=error)
        )


class _NeverLeaves:
    """The client channel of an in-process request: it never disconnects."""

    @property
    def receive(self) -> Callable[[], Awaitable[Any]]:
        return self._wait

    async def _wait(self) -> Any:
        await asyncio.Event().wait()


async def embed_in_process(context: ApiContext, model: str, inputs: Sequence[str]) -> list[list[float]]:
    """What POST /v1/embeddings answers for `model` and `inputs`, without HTTP (for
    `ExtensionContext.embed`): typed API errors as that route raises them."""
    params = for_placed_model(context, EmbeddingParams(model_id=ModelId(model), inputs=list(inputs)))
    vectors, _ = await embeddings_of(_NeverLeaves(), context, params)  # pyright: ignore[reportArgumentType]
    return vectors
