"""One text generation on the API side, from bound params to a response.

A route is parse -> params -> `Generation.start` -> encode: `start` binds the request once
(`generation.bind_instance`: placed, features, context, limits, serving, master) and submits
one command per choice (per prompt and choice, for legacy completions); the route then
either streams it (`stream`) or collects it (`collect`). One choice or several, streamed or
not, is decided here once, not in each route. A failure before any output raises from
`stream` as the typed error (the route answers an HTTP error in its caller's shape, never a
200 followed by an error event), and a client that leaves cancels every choice (through
`generation.drive`). Modelled on vLLM's `EngineClient.generate`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import cast

from fastapi.responses import StreamingResponse

from skulk.api.chat_middleware import observe_collected, observed, transformed
from skulk.api.context import ApiContext
from skulk.api.errors import StreamFailed
from skulk.api.generation import (
    SSE_HEADERS,
    ChoiceEncoder,
    ClientChannel,
    StreamEncoder,
    collect_choices,
    drive,
    encoded_choice_events,
    encoded_events,
    open_output,
    open_outputs,
    start_choices,
    start_generation,
)
from skulk.api.streams import CommandStream
from skulk.extensions.summary import ChatWire
from skulk.shared.types.chunks import TokenChunk
from skulk.shared.types.tasks import TextGenerationParams


@dataclass(frozen=True)
class Generation:
    """The commands of one request's generation: `streams[i]` is choice i (prompts in order,
    each with its `n` choices)."""

    request: ClientChannel
    context: ApiContext
    params: TextGenerationParams
    """The first prompt's params (the shaping of every choice's output follows them)."""
    streams: list[CommandStream]
    wire: ChatWire | None = None
    """The chat wire format the request came in, when the node's extensions see it: its
    params went through their transforms and its output goes to their observers."""

    @classmethod
    async def start(
        cls, request: ClientChannel, context: ApiContext, params: TextGenerationParams | Sequence[TextGenerationParams],
        n: int = 1, *, max_tokens_param: str = "max_tokens", param_names: Mapping[str, str] | None = None,
        wire: ChatWire | None = None,
    ) -> Generation:
        """Bind and submit `n` choices of `params` (one params per prompt: `n` of each). With
        `wire`, the params first go through the node's chat transforms
        (`skulk.api.chat_middleware`), before binding, so every check sees what runs."""
        every = [params] if isinstance(params, TextGenerationParams) else list(params)
        if wire is not None:
            every = [await transformed(context, one) for one in every]
        if len(every) == 1 and n == 1:
            streams = [await start_generation(context, every[0], max_tokens_param=max_tokens_param,
                                              param_names=param_names)]
        else:
            streams = [stream for one in every for stream in await start_choices(
                context, one, n, max_tokens_param=max_tokens_param, param_names=param_names)]
        return cls(request, context, every[0], streams, wire)

    @property
    def command_id(self) -> str:
        """The request's id: its first choice's command."""
        return self.streams[0].command_id

    @property
    def several(self) -> bool:
        return len(self.streams) > 1

    async def stream(
        self, encoder_for: Callable[[int], StreamEncoder], on_failure: Callable[[StreamFailed], Iterable[str]],
        *, media_type: str = "text/event-stream",
    ) -> StreamingResponse:
        """The streaming response: each choice's chunks encoded by `encoder_for(index)` (a
        `ChoiceEncoder` when there are several), or the format's error events (`on_failure`)
        when the stream fails after it started."""
        return StreamingResponse(await self.events(encoder_for, on_failure), media_type=media_type,
                                 headers=SSE_HEADERS)

    async def events(
        self, encoder_for: Callable[[int], StreamEncoder], on_failure: Callable[[StreamFailed], Iterable[str]],
    ) -> AsyncGenerator[str, None]:
        """The encoded events of `stream`, for a transport other than an HTTP response."""
        if not self.several:
            stream = self.streams[0]
            output = self._observed(await open_output(self.request, self.context, stream, self.params), 0)
            return encoded_events(self.request, self.context, stream, encoder_for(0), on_failure,
                                  self.params, output)
        outputs = [self._observed(output, i) for i, output in enumerate(
            await open_outputs(self.request, self.context, self.streams, self.params))]
        encoders = cast(list[ChoiceEncoder], [encoder_for(i) for i in range(len(self.streams))])
        return encoded_choice_events(self.streams, outputs, encoders, on_failure)

    async def collect(self) -> list[list[TokenChunk]]:
        """Every choice's shaped chunks, once all have ended; the first failure raises."""
        if not self.several:
            async with aclosing(drive(self.request, self.context, self.streams[0], self.params)) as output:
                collected = [[chunk async for chunk in output]]
        else:
            collected = await collect_choices(self.request, self.context, self.streams, self.params)
        if self.wire is not None:
            for index, chunks in enumerate(collected):
                observe_collected(self.context, chunks, wire=self.wire, request_id=self.command_id,
                                  model_id=self.params.model_id, choice_index=index)
        return collected

    def _observed(self, output: AsyncGenerator[TokenChunk, None], index: int) -> AsyncGenerator[TokenChunk, None]:
        """A streamed choice's output, tapped for the extensions' observers (when `wire`)."""
        if self.wire is None:
            return output
        return observed(self.context, output, wire=self.wire, request_id=self.command_id,
                        model_id=self.params.model_id, choice_index=index)


__all__ = ["Generation"]
